"""Errors of the world (disk full, file too large, a path that is a folder or cannot be created) and malformed
input files give one line naming the path, never a traceback; the folder keeps what it held and the same command
then completes (issue 36, 3g)."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coclr.cli import main
from coclr.cli._world import world_error_line

REPO_ROOT = Path(__file__).resolve().parents[1]


def _result(tmp_path: Path, **changes) -> Path:
    record = {"task": "retrieval", "results": {"R@1": 33.1}, "dataset": "tiny",
              "streams": [{"checkpoint": "/ckpt/a.pt", "checkpoint_sha256": "a", "view": "rgb",
                           "meta": {"method": "infonce"}}], **changes}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(record))
    return path


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("change, message", [
    ({"streams": ["rgb"]}, r"streams\[0\]: not a mapping"),
    ({"streams": [{"view": "rgb"}]}, r"streams\[0\]\.checkpoint: missing"),
    ({"results": [33.1]}, "results: not a mapping"),
    ({"results": {"R@1": "high"}}, "results.R@1: not a number"),
    ({"feature_health": [{"train": {}}]}, "feature_health"),
    ({"config": {"clips": 3}}, "config"),
    ({"neighbours": {"query_keys": ["a"], "query_labels": [0], "gallery_keys": ["b"], "gallery_labels": [0],
                     "classes": ["c"], "topk_indices": [[5]]}}, "neighbours.topk_indices"),
    ({"neighbours": {"query_keys": ["a"]}}, "neighbours: query_labels"),
])
def test_a_malformed_results_file_is_one_line_before_any_write(tmp_path, capsys, change, message):
    """These gave TypeError, KeyError or AttributeError tracebacks (after table.md was written for some)."""
    import re

    out = tmp_path / "report"
    assert main(["report", "--results", str(_result(tmp_path, **change)), "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert "result.json: not a valid 'coclr eval' result" in line and re.search(message, line), line
    assert not out.exists()


def test_absurdly_nested_json_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000)
    assert main(["report", "--results", str(path), "--out", str(tmp_path / "report")]) == 2
    assert "deep.json: not valid JSON" in _one_line(capsys)


def test_output_paths_that_are_folders_or_under_a_file(tmp_path, capsys):
    result = _result(tmp_path)
    out = tmp_path / "report"
    assert main(["report", "--results", str(result), "--out", str(out)]) == 0
    (out / "table.md").unlink()
    (out / "table.md").mkdir()  # EISDIR: the output file is a folder
    capsys.readouterr()
    assert main(["report", "--results", str(result), "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert str(out / "table.md") in line and "is a folder" in line
    assert not any(name.endswith(".partial") for name in os.listdir(out))
    (out / "table.md").rmdir()
    assert main(["report", "--results", str(result), "--out", str(out)]) == 0  # the rerun completes
    assert "| InfoNCE | RGB |" in (out / "table.md").read_text()
    capsys.readouterr()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["report", "--results", str(result), "--out", str(blocker / "sub")]) == 2  # ENOTDIR / EEXIST
    assert str(blocker) in _one_line(capsys)


def test_a_full_disk_is_one_line_naming_the_file_and_keeps_the_folder(tmp_path, capsys, monkeypatch):
    result = _result(tmp_path)
    out = tmp_path / "report"
    assert main(["report", "--results", str(result), "--out", str(out)]) == 0
    before = _files(out)
    capsys.readouterr()
    result.write_text(result.read_text().replace("33.1", "40.2"))

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    assert main(["report", "--results", str(result), "--out", str(out)]) == 2
    line = _one_line(capsys)
    assert "No space left on device" in line and str(out / "table.md") in line and "disk is full" in line
    assert _files(out) == before  # nothing half-written, no temporary file left
    monkeypatch.undo()
    assert main(["report", "--results", str(result), "--out", str(out)]) == 0
    assert "40.2" in (out / "table.md").read_text()


def test_a_file_size_limit_is_one_line_not_a_signal(tmp_path):
    """Past ``ulimit -f`` the kernel sends SIGXFSZ, which killed the process (no message, a core dump)."""
    result = _result(tmp_path)
    out = tmp_path / "report"
    command = [sys.executable, "-m", "coclr", "report", "--results", str(result), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")}

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    run = subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=120)
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "File too large" in run.stderr and str(out) in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not any(name.endswith(".partial") for name in os.listdir(out))
    assert subprocess.run(command, capture_output=True, env=env, timeout=120).returncode == 0
    assert "| InfoNCE | RGB |" in (out / "table.md").read_text()


def test_world_error_line_names_the_path_and_leaves_other_errors_alone():
    assert world_error_line(OSError(errno.ENOSPC, "No space left on device", "/x/y")).startswith(
        "/x/y: No space left on device (the disk is full")
    assert world_error_line(OSError(errno.ECONNRESET, "reset")) is None
    assert signal.getsignal(signal.SIGXFSZ) is not None


def test_a_reader_that_goes_away_ends_the_command_quietly_with_sigpipes_status():
    from coclr.cli import EXIT_PIPE

    for argv in (["pretrain", "--list-options"], ["--version"]):  # (--version: a traceback, status 1)
        process = subprocess.Popen([sys.executable, "-m", "coclr", *argv], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        process.stdout.close()  # `| head` that has read what it wanted, before the command prints
        errors = process.stderr.read()
        assert process.wait(timeout=120) == EXIT_PIPE == 141 and errors == b"", (argv, errors[-300:])


def test_a_refusal_whose_reader_went_away_still_exits_as_a_refusal(tmp_path):
    """``coclr flow MISSING 2>&1 | true``: the refusal's line has nowhere to go, and the status stays 2 (it was 1, a
    traceback's, from the BrokenPipeError raised while printing it)."""
    reading, writing = os.pipe()
    process = subprocess.Popen([sys.executable, "-m", "coclr", "flow", str(tmp_path / "missing")], stdout=writing,
                               stderr=writing)
    os.close(writing)
    os.close(reading)  # the reader gone before the command prints anything (it is still importing)
    assert process.wait(timeout=120) == 2


def test_a_path_that_cannot_be_made_and_a_device_this_torch_lacks_are_one_line():
    from coclr.distributed import pick_device
    from coclr.errors import ConfigError

    assert world_error_line(OSError(errno.ENOENT, "No such file or directory", "/proc/x")) == (
        "/proc/x: No such file or directory (no such file or folder, and none can be made there: give another path)")
    import torch

    lacking = ["meta"] + [name for name, here in (("mps", torch.backends.mps.is_available()),
                                                  ("xpu", torch.xpu.is_available())) if not here]
    for name in lacking:  # devices torch knows, which this machine's torch cannot run on
        with pytest.raises(ConfigError, match=f"--device: '{name}' is not a device this torch can run on here"):
            pick_device(name, "--device")
    assert pick_device("cpu").type == "cpu"


def test_an_output_path_that_is_a_link_to_nothing_is_named_so(tmp_path, capsys):
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    assert main(["data", "synth", "--videos", str(tmp_path / "out")]) == 2
    line = _one_line(capsys)
    assert f"a link to {tmp_path / 'elsewhere'}, which does not exist" in line, line


def test_a_bar_half_made_when_the_signal_came_is_left_as_it_is():
    """SIGTERM inside tqdm's constructor (CI saw it): the bar is listed before it has a position, and closing it
    raised AttributeError while the stopped command closed its bars, a traceback instead of the one line."""
    import io

    from tqdm import tqdm

    from coclr.cli import _close_progress_bars

    half = tqdm.__new__(tqdm)  # listed by tqdm, and stopped in its constructor after `disable`, before `pos`
    half.disable = False
    whole = tqdm(total=3, file=io.StringIO())
    try:
        _close_progress_bars()
    finally:
        tqdm._instances.discard(half)
        half.disable = True  # (its own closing, when collected, would raise as it did)
    assert whole.disable  # closed


def test_a_refusal_is_written_in_one_write(tmp_path, monkeypatch):
    """The line and its newline were two writes: the processes of a torchrun job refusing at once ran their lines
    together ("...start overcoclr pretrain: error: ...")."""
    import sys

    from coclr.cli import main

    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    assert main(["report", "--out", str(tmp_path / "r")]) == 2
    said = [text for text in writes if "error:" in text]
    assert len(said) == 1 and said[0].startswith("coclr report: error: --results or --run") and said[0].endswith("\n")
