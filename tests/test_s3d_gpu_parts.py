"""benchmarks/s3d_gpu_parts.py in its tiny version on the CPU (its figures mean nothing there; on a GPU the same
command measures): the profiles of the network and of the trainer's step read operators, and every convolution's 2-D
form gives the conv3d's output (the benchmark asserts it). Its pools' part runs the Triton kernels, which
tests/test_pool_triton.py checks under the interpreter (the part itself is too slow there to run in the suite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import s3d_gpu_parts  # benchmarks/ is on the path (pyproject's pythonpath)


def test_the_folded_form_of_every_s3d_convolution_is_the_conv3d(tmp_path: Path) -> None:
    out = tmp_path / "parts.json"
    assert s3d_gpu_parts.main(["--tiny", "--parts", "profile,convs,stepprofile", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert not any("error" in report[part] for part in ("profile", "convs", "stepprofile")), report
    for method in ("infonce", "coclr"):  # the trainer's whole step, profiled
        table = report["stepprofile"][method]
        assert table["wall_ms_per_step"] > 0 and table["top"] and "aten::convolution_backward" in table[
            "ops_us_per_iteration"]
    assert report["profile"]["clips_per_s"] > 0 and "aten::convolution_backward" in report["profile"][
        "ops_us_per_iteration"]
    rows = report["convs"]["convs"]
    assert len(rows) == 77 and all(row["max_rel_diff"] < 1e-5 for row in rows)  # float32 on the CPU


def test_fold_refuses_what_is_not_a_view_of_a_2d_convolution() -> None:
    assert s3d_gpu_parts.fold(nn.Conv3d(4, 4, 3, padding=1, bias=False)) is None
    conv = nn.Conv3d(4, 6, (3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0), bias=False)
    x = torch.randn(2, 4, 7, 5, 3).contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(s3d_gpu_parts.fold(conv)(x, conv.weight), conv(x), atol=1e-5)


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
