"""The search's int8 kernels alone: multiply-adds a second of the stored scores (``coclr_i8_scores``) and of the fused
range pass (``coclr_i8_over_floor``), one thread, on random unit rows of 128 and 1,024 numbers, against the kernels
of an earlier commit (their source from git, compiled with the same flags), interleaved A B B A; both sides' scores
are checked equal first.

    python benchmarks/search_kernel.py [--against e766641] [--rows 50000] [--queries 1024]

The build is this CPU's (``coclr.native``); with ``coclr.cpu.AVX2_LIMIT`` in the environment, the AVX2 one.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from coclr import native
from coclr.embed import search_cpu
from coclr.eval.exact import unit_rows

REPO = Path(__file__).resolve().parent.parent
SOURCE = "src/coclr/embed/search_cpu.c"


def earlier(revision: str, folder: Path) -> ctypes.CDLL:
    """The kernels of ``revision`` (queries unpacked, no scores from the range pass), compiled here."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:{SOURCE}"], capture_output=True, text=True,
                            check=True).stdout
    (folder / "search_cpu.c").write_text(source)
    kernel = native.Kernel("search_cpu_earlier", folder / "search_cpu.c", ctypes.CDLL, "")
    library = ctypes.CDLL(str(kernel.compile(list(native.find_compiler()), list(native.compile_flags()), folder)))
    library.coclr_i8_kernel.restype = ctypes.c_char_p
    library.coclr_i8_scores.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long] * 2 + [ctypes.c_int] * 2 + \
        [ctypes.c_void_p]
    library.coclr_i8_over_floor.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_long] * 2 + [ctypes.c_int] * 2 + \
        [ctypes.c_long] + [ctypes.c_void_p] * 2
    library.coclr_i8_over_floor.restype = ctypes.c_long
    return library


def calls(ours: ctypes.CDLL, theirs: ctypes.CDLL, dim: int, count: int, nq: int,
          rng: np.random.Generator) -> tuple[bool, dict[str, dict[str, object]], int]:
    """Whether both sides' scores are equal, each kind's call of each side (no arguments), and the multiply-adds of a
    call."""
    ptr = search_cpu._ptr  # noqa: SLF001 (the module's own pointer helper)
    rows, scales, _, _ = search_cpu.quantise_rows(unit_rows(rng.normal(size=(count, dim))))
    queries = search_cpu.Queries(unit_rows(rng.normal(size=(nq, dim))))
    packed, query_scales, offsets = queries.packed(ours.coclr_i8_block())
    width = rows.shape[1]
    out, reference = np.empty((count, nq), np.float32), np.empty((count, nq), np.float32)
    floors = np.full(len(offsets), 0.3, np.float32)  # (about 1 pair in 10^6 reaches it: random rows)
    hits = [np.empty(count * 4 + 1024, np.int64) for _ in range(2)]
    def ours_common() -> tuple[int, ...]:  # (the pointers taken at each call: the closures keep the arrays alive)
        return ptr(rows), ptr(packed), ptr(scales), ptr(query_scales), ptr(offsets)

    def theirs_common() -> tuple[int, ...]:
        return ptr(rows), ptr(queries.bytes), ptr(scales), ptr(queries.scales), ptr(queries.offsets)

    def found() -> tuple[int, ...]:
        return len(hits[0]), ptr(hits[0]), ptr(hits[1])

    table = {
        "scores": {"ours": lambda: ours.coclr_i8_scores(*ours_common(), 0, count, nq, width, ptr(out)),
                   "theirs": lambda: theirs.coclr_i8_scores(*theirs_common(), 0, count, nq, width, ptr(reference))},
        "over_floor": {"ours": lambda: ours.coclr_i8_over_floor(*ours_common(), ptr(floors), 0, count, nq, width,
                                                                *found(), None),
                       "theirs": lambda: theirs.coclr_i8_over_floor(*theirs_common(), ptr(floors), 0, count, nq,
                                                                    width, *found())},
    }
    table["scores"]["ours"]()
    table["scores"]["theirs"]()
    return bool(np.array_equal(out, reference)), table, count * nq * width


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="e766641", help="the commit whose kernels are compared")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--queries", type=int, default=1024)
    args = parser.parse_args()
    ours = search_cpu.KERNEL.load()
    if ours is None:
        sys.exit("the int8 kernels do not build here")
    with tempfile.TemporaryDirectory() as folder:
        theirs = earlier(args.against, Path(folder))
        print(f"kernels: ours {search_cpu.kernel()}, {args.against}'s {theirs.coclr_i8_kernel().decode()}; one thread; "
              f"{args.rows} rows x {args.queries} queries")
        rng = np.random.default_rng(0)
        for dim in (128, 1024):
            same, table, work = calls(ours, theirs, dim, args.rows, args.queries, rng)
            if not same:
                sys.exit(f"the scores differ at {dim} numbers")
            for kind, sides in table.items():
                times: dict[str, list[float]] = {"ours": [], "theirs": []}
                for side in ("ours", "theirs", "theirs", "ours"):
                    begin = time.perf_counter()
                    sides[side]()
                    times[side].append(time.perf_counter() - begin)
                rate = {side: work / np.mean(seconds) / 1e9 for side, seconds in times.items()}
                print(f"{dim:5d} numbers {kind:10s}: ours {rate['ours']:6.1f} G multiply-adds/s, {args.against} "
                      f"{rate['theirs']:6.1f}: {rate['ours'] / rate['theirs']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
