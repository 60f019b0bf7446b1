"""benchmarks/gpu_suite.py in its tiny version: every part runs and reports finite figures (no timing is checked;
on a GPU machine the same command measures the full suite)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import gpu_suite  # benchmarks/ is on the path (conftest)

EXPECTED_CASES = {
    "decoders": ["cv2.imdecode, 1 core", "PIL, 1 core", "PIL / cv2.imdecode"],
    "loader_core": ["reference: frame files", "ours: store read + decode + fit", "ours + ClipAugment on the CPU",
                    "ours, workers read bytes", "ours / reference", "ours + CPU augmentation / reference"],
    "step": ["infonce fp32, batch", "coclr fp32, batch", "read-back ops per step, infonce"],
    "dataloader": ["rgb, 0 workers, decoded in the workers", "rgb, 2 workers, decoded in the training process",
                   "rgb+flow, 2 workers, decoded in the workers"],
    "epoch": ["infonce epoch through the Trainer", "coclr epoch through the Trainer",
              "infonce epoch, decode workers, share of the"],
    "features": ["retrieval features, test split"],
    "flow": ["our TV-L1"],
    "projection": ["flow (TV-L1", "InfoNCE, 300 epochs", "CoCLR, 2 cycles", "retrieval features, 4 encoders",
                   "the whole UCF101 study"],
}


@pytest.mark.slow
def test_the_tiny_suite_reports_every_part(tmp_path: Path, capsys) -> None:
    out = tmp_path / "suite.json"
    assert gpu_suite.main(["--tiny", "--device", "cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) >= {"environment", "tiny", "seconds", "parts", "rows"} and result["tiny"]
    assert list(result["parts"]) == list(gpu_suite.PARTS)
    assert result["parts"]["quality"]["status"].startswith("skipped: bf16 autocast is for CUDA")
    assert all(part["status"] == "done" for name, part in result["parts"].items() if name != "quality")
    rows = result["rows"]
    assert all(set(row) == {"part", "case", "value", "unit", "note"} for row in rows)
    assert all(math.isfinite(row["value"]) and row["value"] >= 0 for row in rows)
    assert all(row["value"] > 0 for row in rows if not row["case"].startswith("read-back"))
    for part, cases in EXPECTED_CASES.items():
        found = [row["case"] for row in rows if row["part"] == part]
        for case in cases:
            assert any(name.startswith(case) for name in found), (part, case, found)
    assert all("CPU" in row["note"] for row in rows if row["part"] == "projection")
    table = capsys.readouterr().out
    assert "| part | case | value | unit | note |" in table and "| projection | the whole UCF101 study |" in table


BARE_MACHINE = """
import sys
sys.modules["av"] = None  # import av raises ImportError, as on a machine without PyAV
sys.modules["xxhash"] = None  # nor xxhash
import cv2
if hasattr(cv2, "optflow"):
    del cv2.optflow
sys.modules["cv2.optflow"] = None  # no OpenCV contrib modules
"""


def run_on_a_bare_machine(tmp_path: Path, script: str) -> str:
    """Run ``script`` (Python, in benchmarks/) as a bare GPU machine would: ``av``, ``xxhash`` and ``cv2.optflow``
    unimportable, no ../shared; returns its output, after checking that it succeeded."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BARE_MACHINE)
    benchmarks = Path(gpu_suite.__file__).resolve().parent
    env = {**os.environ, "COCLR_SHARED": str(tmp_path / "no_shared"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(site), str(benchmarks.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    check = ("import sys, cv2; assert sys.modules['av'] is None and sys.modules['xxhash'] is None "
             "and not hasattr(cv2, 'optflow'); ")
    result = subprocess.run([sys.executable, "-c", check + script], cwd=benchmarks, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_the_quick_suite_runs_without_pyav_opencv_contrib_or_shared_data(tmp_path: Path) -> None:
    """``--quick --out`` as a bare GPU machine runs it (its own packages only), here tiny on the CPU: each part's
    figures are in the JSON file."""
    out = tmp_path / "quick.json"
    run_on_a_bare_machine(tmp_path, "import gpu_suite; sys.exit(gpu_suite.main(['--quick', '--tiny', '--device', "
                                    f"'cpu', '--out', {str(out)!r}]))")
    saved = json.loads(out.read_text())
    assert list(saved["parts"]) == list(gpu_suite.QUICK_PARTS)
    assert all(part["status"] == "done" for part in saved["parts"].values()), saved["parts"]
    cases = [row["case"] for row in saved["rows"]]
    for start in ("our TV-L1 fast", "our TV-L1 exact", "infonce fp32, batch", "infonce epoch through the Trainer",
                  "infonce epoch, decode workers, share of the time the CPU waited"):
        assert any(case.startswith(start) for case in cases), (start, cases)


def test_the_epoch_part_runs_the_decode_modes_asked_in_their_order(tmp_path: Path) -> None:
    """``--decode workers,device,device,workers`` (A B B A): each method's epoch once per value, in that order, each
    row naming the mode the Trainer used."""
    out = tmp_path / "epoch.json"
    assert gpu_suite.main(["--tiny", "--device", "cpu", "--parts", "epoch", "--decode", "workers,device,device,workers",
                           "--out", str(out)]) == 0
    rates = [row["case"] for row in json.loads(out.read_text())["rows"] if "epoch through the Trainer" in row["case"]]
    assert [case.split(", decode ")[1] for case in rates] == ["workers", "device", "device", "workers"] * 2
    assert [case.split(" ")[0] for case in rates] == ["infonce"] * 4 + ["coclr"] * 4
    with pytest.raises(SystemExit):
        gpu_suite.main(["--tiny", "--device", "cpu", "--parts", "epoch", "--decode", "nvjpeg", "--out", str(out)])


def test_a_part_past_its_hard_time_limit_is_stopped_and_the_suite_goes_on(tmp_path: Path, monkeypatch) -> None:
    import time

    def endless(suite, budget):
        suite.add("flow", "measured before the limit", 1.0, "pairs/s")
        while True:
            time.sleep(0.01)

    monkeypatch.setitem(gpu_suite.PART_FUNCTIONS, "flow", endless)
    monkeypatch.setattr(gpu_suite, "hard_limit", lambda budget_s: 0.5)
    reports = []
    suite = gpu_suite.run_suite(["flow", "projection"], True, tmp_path, gpu_suite.torch.device("cpu"),
                                lambda s: reports.append(dict(s.parts)))
    assert suite.parts["flow"]["status"].startswith("stopped at its time limit of 0 s")
    assert [row.case for row in suite.rows if row.part == "flow"] == ["measured before the limit"]
    assert suite.parts["projection"]["status"] != "pending"
    assert len(reports) >= 3 and "flow" in reports[0]  # after the row measured before the limit, and each part


def test_bench_tvl1_starts_on_a_bare_machine_and_says_what_it_skips(tmp_path: Path) -> None:
    out = run_on_a_bare_machine(tmp_path, "sys.argv = ['bench_tvl1.py', '--pairs', '1', '--sizes', '24x32']; "
                                          "import bench_tvl1; bench_tvl1.main()")
    lines = out.splitlines()
    for section in ("middlebury", "agreement", "e2e"):
        assert any(line.startswith(f"{section}: skipped, no ") for line in lines), (section, out)
    speed = next(line for line in lines if line.startswith("24x32 (synthetic"))
    assert "OpenCV: not measured (no cv2.optflow" in speed and "ours CPU exact 1 thread" in speed, speed
    assert "ours CPU fast 1 thread" in speed
