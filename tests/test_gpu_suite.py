"""benchmarks/gpu_suite.py in its tiny version: every part runs and reports finite figures (no timing is checked;
on a GPU machine the same command measures the full suite)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gpu_suite  # benchmarks/ is on the path (conftest)

EXPECTED_CASES = {
    "decoders": ["cv2.imdecode, 1 core", "PIL, 1 core", "PIL / cv2.imdecode"],
    "loader_core": ["reference: frame files", "ours: store read + decode + fit", "ours + ClipAugment on the CPU",
                    "ours, workers read bytes", "ours / reference", "ours + CPU augmentation / reference"],
    "step": ["infonce fp32, batch", "coclr fp32, batch", "read-back ops per step, infonce"],
    "dataloader": ["rgb, 0 workers, decoded in the workers", "rgb, 2 workers, decoded in the training process",
                   "rgb+flow, 2 workers, decoded in the workers"],
    "epoch": ["infonce epoch through the Trainer", "coclr epoch through the Trainer"],
    "features": ["retrieval features, test split"],
    "flow": ["our TV-L1"],
    "projection": ["flow (TV-L1", "InfoNCE, 300 epochs", "CoCLR, 2 cycles", "retrieval features, 4 encoders",
                   "the whole UCF101 study"],
}


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
