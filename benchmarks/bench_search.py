"""``coclr search`` against FAISS ``IndexFlatIP`` on an embedding folder of ``--rows`` x ``--dim`` (issue 37, item 5).

Two comparisons, ratios theirs / ours in seconds (> 1: ours faster), medians of interleaved A B B A runs with the
same thread settings on both sides (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and FAISS's
``omp_set_num_threads`` all ``--threads``):

1. One query as a command: ``python -m coclr search DIR --query ROW -k 10 --json`` (its rows prepared beforehand by
   a first search, as every later search finds them) against a one-shot script a FAISS user would write: load
   ``videos.npy``, build an ``IndexFlatIP``, search the row, read the hits' paths from ``videos.jsonl``, print them.
2. 100 queries at once, in one process: :func:`coclr.embed.search.nearest` over the prepared, memory-mapped rows
   against a prebuilt ``IndexFlatIP`` searched with FAISS's default dispatch and with its BLAS path forced
   (``distance_compute_blas_threshold``); the faster FAISS path is the one to beat.

The folder holds random unit rows (normal, normalised), made once under ``--work`` and reused. The neighbours of
both sides are compared (same rows, or FAISS's differ only where float32 rounding reorders near-equal scores).

    nice -n 5 python benchmarks/bench_search.py [--rows 200000] [--dim 1024] [--threads 1] [--repeats 3]

``compare_search(...)`` returns the rows (``benchmarks/compare.py`` calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]

FAISS_SCRIPT = r'''
import json, sys
import faiss, numpy as np
folder, row, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = np.load(f"{folder}/videos.npy")
index = faiss.IndexFlatIP(rows.shape[1])
index.add(rows)
scores, found = index.search(rows[row: row + 1], k + 1)
lines = open(f"{folder}/videos.jsonl").readlines()
hits = [(float(s), int(r)) for s, r in zip(scores[0], found[0]) if r != row][:k]
print(json.dumps([{"row": r, "score": s, "path": json.loads(lines[r])["path"]} for s, r in hits]))
'''

IN_PROCESS = r'''
import json, sys, time
import numpy as np
import faiss
from coclr.embed.output import Embeddings
from coclr.embed import search_cpu
from coclr.embed.search import first_pass_kind, folder_rows, nearest
folder, threads, repeats, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
faiss.omp_set_num_threads(threads)
embeddings = Embeddings(folder)
prepared = folder_rows(embeddings)
rows = np.ascontiguousarray(embeddings.videos)
queries = np.ascontiguousarray(rows[np.linspace(0, len(rows) - 1, count).astype(int)] + 0.01, np.float32)
queries /= np.linalg.norm(queries, axis=1, keepdims=True)
index = faiss.IndexFlatIP(rows.shape[1])
index.add(rows)
default_threshold = faiss.cvar.distance_compute_blas_threshold

def ours():
    return nearest(prepared, queries, 10)

def faiss_with(threshold):
    def run():
        faiss.cvar.distance_compute_blas_threshold = threshold
        try:
            return index.search(queries, 10)
        finally:
            faiss.cvar.distance_compute_blas_threshold = default_threshold
    return run

sides = {"ours": ours, "faiss_default": faiss_with(default_threshold), "faiss_blas": faiss_with(1)}
times = {name: [] for name in sides}
results = {name: run() for name, run in sides.items()}  # warm: pages in memory, BLAS started
for _ in range(repeats):
    for name in ["ours", "faiss_default", "faiss_blas", "faiss_blas", "faiss_default", "ours"]:
        start = time.perf_counter()
        sides[name]()
        times[name].append(time.perf_counter() - start)
same = {name: float(np.mean(results["ours"][1] == value[1])) for name, value in results.items()}
print(json.dumps({"times": times, "same_rows": same, "default_threshold": default_threshold,
                  "first_pass": first_pass_kind(prepared, count), "int8_kernel": search_cpu.kernel()}))
'''


def thread_env(threads: int) -> dict[str, str]:
    """The environment both sides run with: the same thread count for OpenMP and every BLAS."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "OMP_NUM_THREADS": str(threads),
            "OPENBLAS_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def make_folder(root: Path, rows: int, dim: int, seed: int = 0) -> Path:
    """An embedding folder of ``rows`` random unit rows, each the row of a real (empty) file, so that a search serves
    it (a row whose file is missing or changed is never served); reused when it exists with that shape."""
    folder = root / f"search_{rows}x{dim}"
    files = folder / "files"
    if ((folder / "embed.json").is_file() and np.load(folder / "videos.npy", mmap_mode="r").shape == (rows, dim)
            and (files / f"v{rows - 1:07d}.mp4").is_file()):
        return folder
    files.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(folder / "videos.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
    for start in range(0, rows, 16384):
        block = rng.standard_normal((min(16384, rows - start), dim), dtype=np.float32)
        out[start: start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    out.flush()
    del out
    write_records(folder, rows, dim)
    return folder


def write_records(folder: Path, rows: int, dim: int) -> None:
    """The rest of an embedding folder whose ``videos.npy`` holds ``rows`` rows: each row the row of a real empty file
    (``folder/files``; a search serves only rows whose file is there), no windows, no failures, its ``embed.json``."""
    from coclr.atomic import atomic_write_json, atomic_write_text

    files = folder / "files"
    files.mkdir(parents=True, exist_ok=True)
    np.save(folder / "windows.npy", np.zeros((0, dim), np.float32))
    atomic_write_text(folder / "windows.jsonl", "")
    atomic_write_text(folder / "failed.jsonl", "")
    records = []
    for row in range(rows):
        path = files / f"v{row:07d}.mp4"
        path.touch()
        stat = path.stat()
        records.append(json.dumps({"row": row, "path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                   "duration": 10.0, "fps": 25.0, "frames": 250, "windows": 0, "first_window": 0}))
    atomic_write_text(folder / "videos.jsonl", "\n".join(records) + "\n")
    atomic_write_json(folder / "embed.json", {"format": "coclr-embeddings", "settings": {}, "dim": dim,
                                              "checkpoint": {"path": str(folder / "none.pth"), "sha256": "0" * 64,
                                                             "format": "ours"}, "flow_checkpoint": None})


def _timed_run(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return time.perf_counter() - start, run.stdout


def _row(path: str, compared: str, ours: list[float], theirs: list[float], **extra) -> dict:
    median_ours, median_theirs = statistics.median(ours), statistics.median(theirs)
    return {"path": path, "compared_with": compared, "ours_s": median_ours, "theirs_s": median_theirs,
            "ratio": median_theirs / median_ours, "ours_spread_s": [min(ours), max(ours)],
            "theirs_spread_s": [min(theirs), max(theirs)], "runs": len(ours), **extra}


def compare_search(rows: int = 200_000, dim: int = 1024, threads: int = 1, repeats: int = 3,
                   work: str | Path | None = None, queries: int = 100) -> list[dict]:
    """The two comparisons of the module docstring, one dict per row: ``path``, ``compared_with``, ``ours_s``,
    ``theirs_s`` (medians), ``ratio`` (theirs / ours: > 1 ours faster), spreads and run counts."""
    import faiss  # noqa: F401  (the comparison needs it: fail here, not in a child)

    work = Path(work or Path(tempfile.gettempdir()) / "coclr_bench_search")
    folder = make_folder(work, rows, dim)
    env = thread_env(threads)
    script = work / "faiss_one_shot.py"
    script.write_text(FAISS_SCRIPT)
    row = rows // 3
    ours_command = [sys.executable, "-m", "coclr", "search", str(folder), "--query", str(row), "-k", "10", "--json"]
    theirs_command = [sys.executable, str(script), str(folder), str(row), "10"]
    _, first = _timed_run(ours_command, env)  # prepares the rows (once per folder) and warms the page cache
    _, theirs_out = _timed_run(theirs_command, env)
    same = [h["row"] for h in json.loads(first)["hits"]] == [h["row"] for h in json.loads(theirs_out)]
    ours, theirs = [], []
    for _ in range(repeats):
        for side in ("ours", "theirs", "theirs", "ours"):
            seconds, _ = _timed_run(ours_command if side == "ours" else theirs_command, env)
            (ours if side == "ours" else theirs).append(seconds)
    table = [_row(f"one coclr search query as a command, {rows}x{dim}", "one-shot FAISS script (IndexFlatIP built "
                  "in the call)", ours, theirs, threads=threads, same_neighbours=same)]
    _, out = _timed_run([sys.executable, "-c", IN_PROCESS, str(folder), str(threads), str(repeats), str(queries)],
                        env)
    result = json.loads(out)
    faster = min(("faiss_default", "faiss_blas"), key=lambda name: statistics.median(result["times"][name]))
    for name, label in (("faiss_default", f"FAISS IndexFlatIP search, default dispatch (BLAS from "
                                          f"{result['default_threshold']} queries)"),
                        ("faiss_blas", "FAISS IndexFlatIP search, BLAS path forced")):
        table.append(_row(f"{queries} queries at once, {rows}x{dim}", label, result["times"]["ours"],
                          result["times"][name], threads=threads, same_neighbours=result["same_rows"][name],
                          faster_faiss_path=name == faster, first_pass=result["first_pass"],
                          int8_kernel=result["int8_kernel"]))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="A B B A rounds (each side runs twice a round)")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--work", help="folder for the embedding folder (default: a temp folder, reused)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"machine load (1, 5, 15 min): {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} CPUs; "
          f"threads {args.threads}")
    table = compare_search(args.rows, args.dim, args.threads, args.repeats, args.work, args.queries)
    for row in table:
        print(f"{row['path']:<48} vs {row['compared_with']:<70} ours {row['ours_s']:7.3f} s "
              f"[{row['ours_spread_s'][0]:.3f}-{row['ours_spread_s'][1]:.3f}]  theirs {row['theirs_s']:7.3f} s "
              f"[{row['theirs_spread_s'][0]:.3f}-{row['theirs_spread_s'][1]:.3f}]  ratio {row['ratio']:5.2f}  "
              f"same neighbours {row['same_neighbours']}")
    print(f"machine load after: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
