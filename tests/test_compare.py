"""benchmarks/compare.py's quick mode runs end to end and writes its table as JSON (figures are not checked:
timings belong to the benchmark, not to tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO_ROOT, shared_path


def test_quick_compare_writes_every_requested_row(tmp_path: Path):
    shared = shared_path("data", "clips").parents[1]
    out = tmp_path / "compare.json"
    env = {**os.environ, "COCLR_SHARED": str(shared)}
    env.pop("COCLR_AUTHORS", None)
    result = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "compare.py"), "--quick",
                             "--rows", "tvl1,loader", "--json", str(out)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {row["row"]: row for row in report["rows"]}
    assert "load average before" in result.stdout and report["load_before"]
    tvl1 = rows["tvl1 32x43 1t"]
    assert tvl1["ratio"] > 0 and len(tvl1["ours_all_s"]) == len(tvl1["theirs_all_s"]) == 2  # A B B A
    # both sides computed flow of the same pair, of similar size (a broken side would give 0 or garbage)
    ours, theirs = tvl1["ours_info"]["mean_abs_flow"], tvl1["theirs_info"]["mean_abs_flow"]
    assert abs(ours - theirs) < 0.1 * theirs + 0.01
    assert "authors" in rows["loader, 1 core"]["skipped"]
