"""`coclr curate` at scale: 100,000 videos x 1024 dimensions, its seconds, its memory, and the page in Chromium.

The folder: unit vectors of structured footage (2,000 groups of alike videos around centres in a 64-dimensional
subspace, plus noise in all 1024), 1% of the videos near-copies of another (noise a tenth as large), each row the row
of a real empty file (a search serves only rows whose file is there); no windows (the video-level pass is what is
timed). `coclr curate --threshold 0.95 --calibrate 0 --thumbnails 0` runs in a child process, its wall time and peak
memory (maxrss) measured, the planted copies' recall and the groups' precision checked. Then the all-pairs step
alone against FAISS's exact `IndexFlatIP` on a part of the rows, interleaved A B B A with equal threads. Then the
page: headless Chromium loads it and times drawing every point and a pan (the harness reads `window.curateView`).
With ``--fingerprint-dim D`` (default 128, a CPU-trained encoder's), also the fingerprints' duplicates graph of as
many random fingerprints (`curate_fingerprint.py`'s child), which the default curation adds to the above.

    python benchmarks/curate_scale.py --work W [--rows 100000] [--dim 1024] [--threads 2] [--fingerprint-dim 128]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench_search import thread_env, write_records  # this folder: the script's own, first on the path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def make_folder(root: Path, rows: int, dim: int, seed: int = 0) -> tuple[Path, np.ndarray]:
    """The folder (reused when there with that shape) and the planted copies (row, original) ``[C, 2]``."""
    folder = root / f"curate_{rows}x{dim}"
    rng = np.random.default_rng(seed)
    copies = rng.choice(rows, size=(rows // 100) * 2, replace=False).reshape(-1, 2)
    if (folder / "embed.json").is_file() and np.load(folder / "videos.npy", mmap_mode="r").shape == (rows, dim):
        return folder, copies
    folder.mkdir(parents=True, exist_ok=True)
    basis = np.linalg.qr(rng.standard_normal((dim, 64)))[0].T  # a 64-dimensional subspace
    centres = rng.standard_normal((2000, 64)).astype(np.float32)
    out = np.lib.format.open_memmap(folder / "videos.npy", mode="w+", dtype=np.float32, shape=(rows, dim))
    for start in range(0, rows, 8192):
        count = min(8192, rows - start)
        inside = centres[rng.integers(len(centres), size=count)] + 0.5 * rng.standard_normal((count, 64))
        block = inside @ basis + 0.25 * rng.standard_normal((count, dim)) / np.sqrt(dim / 64)
        out[start:start + count] = block / np.linalg.norm(block, axis=1, keepdims=True)
    for copy, original in copies:
        noisy = out[original] + 0.025 * rng.standard_normal(dim) / np.sqrt(dim / 64)
        out[copy] = noisy / np.linalg.norm(noisy)
    out.flush()
    del out
    write_records(folder, rows, dim)
    return folder, copies


CHILD = """
import json, resource, sys, time
import coclr.cli
from coclr.curate.run import CurateOptions, curate
begin = time.perf_counter()
summary = curate(sys.argv[1], sys.argv[2], CurateOptions(threshold=0.95, calibrate=0, thumbnails=0, fingerprints=False),
                 show=False)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": time.perf_counter() - begin, "maxrss_mb": peak}))
"""

GRAPH = """
import json, sys, time
import numpy as np
import coclr.cli
from coclr.curate.graph import neighbour_graph
from coclr.embed.output import Embeddings
from coclr.embed.search import folder_rows
rows = folder_rows(Embeddings(sys.argv[1]), center=True)
count = int(sys.argv[2])
if sys.argv[3] == "faiss":
    import faiss
    units = np.ascontiguousarray(rows.block(0, count), np.float32)
    begin = time.perf_counter()
    index = faiss.IndexFlatIP(units.shape[1]); index.add(units); index.search(units, 11)
else:  # the rows as a folder holds them (with their int8 and bfloat16 copies, made at embedding time)
    from coclr.embed.search import UnitRows
    part = UnitRows.in_memory(rows.block(0, count))
    neighbour_graph(UnitRows.in_memory(rows.block(0, 64)), 10)  # untimed: torch imported and the kernels loaded, as
    begin = time.perf_counter()  # faiss is imported untimed (about 1.5 s was timed on our side only)
    neighbour_graph(part, 10)
print(json.dumps({"seconds": time.perf_counter() - begin}))
"""

HARNESS = """<!DOCTYPE html><html><body><iframe id="f" src="out/index.html" width="1200" height="800"></iframe>
<pre id="result">waiting</pre><script>
const frame = document.getElementById('f');
frame.onload = () => {  // at once: --dump-dom waits for this page's load, which waits for the frame's
  const w = frame.contentWindow, view = w.curateView;
  let begin = performance.now(); for (let i = 0; i < 5; i++) view.draw(); const draw = (performance.now() - begin) / 5;
  const canvas = frame.contentDocument.getElementById('canvas'), box = canvas.getBoundingClientRect();
  begin = performance.now();
  canvas.dispatchEvent(new w.MouseEvent('mousedown', {clientX: box.left + 300, clientY: box.top + 300, bubbles: true}));
  for (let i = 1; i <= 10; i++)
    canvas.dispatchEvent(new w.MouseEvent('mousemove', {clientX: box.left + 300 + 10 * i, clientY: box.top + 300,
                                                        bubbles: true}));
  w.dispatchEvent(new w.MouseEvent('mouseup', {bubbles: true}));
  const pan = (performance.now() - begin) / 10;
  begin = performance.now();
  canvas.dispatchEvent(new w.MouseEvent('mousemove', {clientX: box.left + 500, clientY: box.top + 400, bubbles: true}));
  const hover = performance.now() - begin;
  document.getElementById('result').textContent = JSON.stringify({points: w.CURATE.names.length, draw_ms: draw,
    pan_frame_ms: pan, hover_ms: hover, moved: view.x});
};
</script></body></html>"""


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def page_timing(out: Path, work: Path) -> dict:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return {"skipped": "chromium is not installed"}
    site = work / "site"
    site.mkdir(exist_ok=True)
    link = site / "out"
    if not link.exists():
        link.symlink_to(out.resolve())
    (site / "harness.html").write_text(HARNESS)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        begin = time.perf_counter()
        dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'profile'}",
                              "--dump-dom",
                              f"http://127.0.0.1:{server.server_address[1]}/harness.html"],
                             capture_output=True, text=True, timeout=600).stdout
        seconds = time.perf_counter() - begin
    finally:
        server.shutdown()
    found = json.loads(dom.split('<pre id="result">')[1].split("</pre>")[0].replace("&quot;", '"'))
    return {**found, "load_and_run_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", required=True)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fingerprint-dim", type=int, default=128,
                        help="also time the fingerprints' duplicates graph of as many videos (0: not)")
    parser.add_argument("--compare-rows", type=int, default=40_000, help="rows of the A B B A comparison with FAISS")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"cpu: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {args.threads} threads", flush=True)
    begin = time.perf_counter()
    folder, copies = make_folder(work, args.rows, args.dim)
    print(f"folder: {args.rows} x {args.dim} in {time.perf_counter() - begin:.0f} s", flush=True)
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(folder / "search", ignore_errors=True)  # the prepared rows: their first preparation is timed
    run = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(out)], env=thread_env(args.threads),
                         capture_output=True, text=True, check=True)
    timing = json.loads(run.stdout.strip().splitlines()[-1])
    record = json.loads((out / "curate.json").read_text())
    groups = {}
    import csv

    with (out / "duplicates.csv").open() as file:
        for row in csv.DictReader(file):
            groups.setdefault(row["group"], set()).add(int(Path(row["path"]).stem[1:]))
    found = sum(any({int(a), int(b)} <= members for members in groups.values()) for a, b in copies)
    print(f"curate: {timing['seconds']:.1f} s (its parts: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in record["seconds"].items()) + f"), peak memory "
          f"{timing['maxrss_mb']:.0f} MB; {record['groups']} groups, planted copies found {found}/{len(copies)}",
          flush=True)
    if args.fingerprint_dim:  # what the default (fingerprints) adds: their duplicates' graph, timed alone
        from curate_fingerprint import CHILD as FINGERPRINTS  # this folder: the script's own, first on the path

        done = subprocess.run([sys.executable, "-c", FINGERPRINTS, str(args.rows), str(args.fingerprint_dim), "0.8",
                               "range", "0"], env=thread_env(args.threads), capture_output=True, text=True, check=True)
        graph = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"with fingerprints ({args.fingerprint_dim} numbers, the duplicates' range search at 0.8 on random ones "
              f"with planted copies): {graph['seconds']:.1f} s, peak {graph['maxrss_mb']:.0f} MB, copies found "
              f"{graph['found']:.3f}; with the curate above {timing['seconds'] + graph['seconds']:.1f} s (decoding "
              "every video for its fingerprint not counted)", flush=True)
    results = {"ours": [], "faiss": []}
    for side in ("ours", "faiss", "faiss", "ours"):
        done = subprocess.run([sys.executable, "-c", GRAPH, str(folder), str(args.compare_rows), side],
                              env=thread_env(args.threads), capture_output=True, text=True, check=True)
        results[side].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    ours, theirs = np.mean(results["ours"]), np.mean(results["faiss"])
    print(f"all pairs of {args.compare_rows} rows, 10 nearest each (A B B A, {args.threads} threads): ours "
          f"{ours:.1f} s, FAISS IndexFlatIP {theirs:.1f} s: {theirs / ours:.2f}x", flush=True)
    print(f"page: {page_timing(out, work)}", flush=True)
    print(f"this process: peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
