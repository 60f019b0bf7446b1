"""benchmarks/compare.py's quick mode runs end to end and writes its table as JSON (figures are not checked:
timings belong to the benchmark, not to tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_compare_prints_the_cpu_and_runs_limited_to_avx2(tmp_path: Path):
    """Every run names the CPU and its relevant flags; ``--cpu avx2`` runs the table (parent and workers) with the
    kernels limited to AVX2 (coclr.cpu.AVX2_LIMIT), says so, and records it in the JSON."""
    from coclr.cpu import AVX2_LIMIT, cpu_model

    shared = shared_path("data", "clips").parents[1]
    out = tmp_path / "compare.json"
    env = {k: v for k, v in os.environ.items() if k not in AVX2_LIMIT and k != "COCLR_AUTHORS"}
    env["COCLR_SHARED"] = str(shared)
    result = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "compare.py"), "--quick", "--cpu", "avx2",
                             "--rows", "tvl1", "--json", str(out)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    header = result.stdout.splitlines()[0]
    assert cpu_model() in header and "flags:" in header and "emulated AVX2 kind" in header
    report = json.loads(out.read_text())
    assert report["limits"] == AVX2_LIMIT and report["torch_capability"] == "AVX2"
    assert report["cpu"] == cpu_model() and not report["native_bfloat16"]
    assert report["rows"][0]["ratio"] > 0
