"""A reduced one-seed run of `coclr demo`: every stage runs and every result file is written and well formed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REDUCED = ["synth={train_scenes: 4, test_scenes: 2, num_classes: 4, actions_per_scene: 4, clips_per_action: 1, "
           "frames: 10}", "flow_backend=dis", "batch_size=8", "queue_size=16", "topk=2", "infonce_epochs=1",
           "cycle_epochs=1", "ubernce_epochs=1"]


def test_reduced_demo_writes_every_result(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "coclr", "demo", "--out", str(out), "--seed", "3", *REDUCED],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["seed"] == 3 and results["wall_seconds"] > 0
    rows = {(row["method"], row["view"]): row for row in results["rows"]}
    assert set(rows) == {("InfoNCE", "RGB"), ("InfoNCE", "Flow"), ("UberNCE", "RGB"), ("CoCLR", "RGB"),
                         ("CoCLR", "Flow"), ("CoCLR", "RGB+Flow")}
    for row in rows.values():
        assert 0 <= row["linear_top1"] <= 100
        recall = [row["retrieval"][f"R@{k}"] for k in (1, 5, 10, 20)]
        assert all(0 <= r <= 100 for r in recall) and recall == sorted(recall)
    markdown = (out / "results.md").read_text()
    assert "| CoCLR | RGB+Flow |" in markdown and "gap closed" in markdown
    assert (out / "stage_recall.png").stat().st_size > 1000
    gallery = (out / "gallery.html").read_text()
    assert "data:image/gif;base64," in gallery and "http://" not in gallery and "https://" not in gallery
    manifest = json.loads((out / "pipeline" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["stages"]] == ["infonce_rgb", "infonce_flow", "cycle1_rgb", "cycle1_flow",
                                                       "cycle2_rgb", "cycle2_flow"]
    assert all(s["status"] == "done" for s in manifest["stages"])
    # Running it again finds everything done and reproduces the same numbers.
    again = subprocess.run([sys.executable, "-m", "coclr", "demo", "--out", str(out), "--seed", "3", *REDUCED],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["rows"] == results["rows"]
