"""The Triton TV-L1 kernels (the GPU path) checked on the CPU under Triton's interpreter, against the PyTorch
scheme: one pass in both modes, the exact mode's roll-back, the median filter and whole small solves. The checks
run in a child process (tests/triton_checks.py) because ``TRITON_INTERPRET=1`` must be set before Triton is
imported; skipped where Triton is not installed. Also: the implementation is chosen by device, and without Triton
the PyTorch one runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coclr.errors import DataError
from coclr.flow import tvl1
from coclr.flow.tvl1 import TorchPasses, make_passes

TESTS = Path(__file__).resolve().parent
HAVE_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed (pip install triton)")


def interpret(*checks: str, timeout: int = 600, device: str = "cpu") -> str:
    """Run checks of tests/triton_checks.py in a child process, under the interpreter on the CPU, compiled on a
    GPU; returns its output."""
    env = {**os.environ, "CHECK_DEVICE": device,
           "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    result = subprocess.run([sys.executable, str(TESTS / "triton_checks.py"), *checks], env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@needs_triton
def test_kernels_match_the_pytorch_iterations_under_the_interpreter():
    out = interpret("passes", "rollback", "median")
    assert out.splitlines() == ["passes: ok", "rollback: ok", "median: ok"]


@pytest.mark.slow
@needs_triton
def test_a_whole_solve_on_the_triton_kernels_gives_the_pytorch_flow():
    assert interpret("solve").splitlines() == ["solve: ok"]


@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_compiled_kernels_match_the_pytorch_iterations_on_cuda():
    out = interpret("passes", "rollback", "median", "solve", device="cuda")
    assert out.splitlines() == ["passes: ok", "rollback: ok", "median: ok", "solve: ok"]


def test_kernels_are_chosen_by_device_and_fall_back_without_triton(monkeypatch):
    # the CPU runs the C loops where they build (tests/test_flow_tvl1_cpu.py), else PyTorch operations
    from coclr.flow.tvl1_cpu import KERNEL, CPasses  # noqa: PLC0415

    assert isinstance(make_passes("auto", torch.device("cpu")), CPasses if KERNEL.load() else TorchPasses)
    if HAVE_TRITON:
        with pytest.raises(DataError, match="TRITON_INTERPRET=1"):
            make_passes("triton", torch.device("cpu"))  # this process did not start the interpreter
    monkeypatch.setattr(tvl1, "triton_available", lambda: False)
    assert isinstance(make_passes("auto", torch.device("cuda")), TorchPasses)
    with pytest.raises(DataError, match="pip install triton"):
        make_passes("triton", torch.device("cuda"))
    with pytest.raises(ValueError, match="kernels"):
        make_passes("cuda", torch.device("cpu"))


@needs_triton
def test_the_generated_median_code_is_up_to_date():
    from coclr.flow import _median_triton

    source = Path(_median_triton.__file__).read_text()
    assert source.rpartition(_median_triton.MARKER + "\n")[2].strip() == _median_triton.generated_source().strip()
