"""Our CPU paths against the real alternatives, side by side: one table, one JSON file.

Rows (ratio = their time / our time for the same work, > 1 means we are faster):

* ``loader``: training batches with the paper's augmentation, 1 core: our store reader + ``ClipAugment``
  against the authors' ``UCF101LMDB_2CLIP`` with ``get_transform`` from their ``main_nce.py``, run as they are
  from their checkout, on an LMDB (their format) holding the very JPEG bytes of our store. Both give a batch
  of two 32-frame 128x128 clips per video; ours also normalises (theirs does that later, on the GPU).
* ``tvl1 HxW Nt``: our TV-L1 (``coclr.flow.tvl1``, exact mode, ``kernels="auto"``: the fused C loops of
  ``coclr.flow.tvl1_cpu`` where a C compiler builds them; the kernels that ran are recorded in the JSON) against
  OpenCV's ``DualTVL1OpticalFlow`` with the same parameters, on the same grayscale frame pairs of real clips, at
  128x171 and 256x340, on 1 and 2 threads, and on 2 threads while another process spins on one core; and
  ``tvl1 ... C vs torch``: the C loops against the PyTorch operations (``kernels="torch"``) they replace.
  ``wait policy`` rows time our 2-thread TV-L1 under that load with OpenMP's default (active) wait policy
  against the passive policy ``coclr`` sets (:mod:`coclr.threads`), and ours on 2 threads against ours on 1.
* ``s3d step``: one S3D training step (forward, backward, SGD step) on 1 thread, ours against the authors'
  ``backbone/s3dg.py`` with the same weights; the first losses of both are printed.
* ``embed`` and ``search`` rows come from ``benchmarks/bench_embed.py`` (``compare_embed``) and
  ``benchmarks/bench_search.py`` (``compare_search``) when they define them.

Method: each side runs in its own worker process, set up once (data, model, one warm-up call); the parent
then asks A B B A, ``--rounds`` times, one timed call at a time, so slow drifts of the machine's load hit both
sides alike. Both workers of a row get the same thread settings (``torch.set_num_threads``,
``cv2.setNumThreads``, ``OMP_NUM_THREADS``) and the same OpenMP wait policy. The table gives the median time of
each side, the ratio of the medians and the spread of the per-pair ratios (min-max); the machine's CPU and its
load average before and after are printed too: on a shared machine, figures move with the load.

The authors' code comes from ``--authors PATH`` or ``COCLR_AUTHORS`` (a checkout of TengdaHan/CoCLR); their
rows are skipped with one line when it is absent. Their code needs lmdb, msgpack, pandas, tqdm, joblib,
tensorboardX, matplotlib and torchvision; ``--authors-pythonpath`` (or ``COCLR_AUTHORS_PYTHONPATH``) adds a folder
with any of them to the authors' workers only (e.g. a torchvision installed with ``pip install --target``).
A torchvision whose compiled operators do not load with this torch (a CUDA wheel beside a CPU torch) is made
importable by skipping its operator registrations; the transforms their loader uses are pure PIL.

    python benchmarks/compare.py --authors /path/to/CoCLR                # the full table, ~10 minutes
    python benchmarks/compare.py --quick                                 # tiny sizes, seconds (CI)
    python benchmarks/compare.py --rows loader,tvl1 --json out.json
    python benchmarks/compare.py --profile loader                        # where our loader's time goes
    python benchmarks/compare.py --cpu avx2 --rows search                # the AVX2-only CPU kind, emulated

Every run prints the CPU's model and the instruction-set flags that decide which kernels run
(:func:`coclr.cpu.describe`), and records them in the JSON. ``--cpu avx2`` runs the whole table (this process,
the in-process embed rows and every worker) with the kernels of PyTorch, oneDNN, MKL, OpenBLAS, FAISS and NumPy
limited to AVX2 (:data:`coclr.cpu.AVX2_LIMIT`): an emulation of an AVX2-only CPU on this one (same cores, caches
and memory), marked so in the output, not a measurement of another machine.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import atomic_write_json
from coclr.cpu import AVX2_LIMIT, cpu_flags, cpu_model, describe, limits, native_bfloat16
from coclr.runfolder import FolderRefused, check_writable
from coclr.threads import ALLOCATOR_POLICY, OPENMP_POLICY

HERE = Path(__file__).resolve()
SHARED = Path(os.environ.get("COCLR_SHARED", HERE.parents[1].parent / "shared")) / "data"
LOADER_CLIPS = ["v_ApplyEyeMakeup_g01_c01.avi", "v_BaseballPitch_g01_c01.avi", "v_Basketball_g01_c01.avi",
                "archery_ucf_format.avi"]
FLOW_CLIPS = {128: "v_Basketball_g01_c01.avi", 256: "arm_wrestling.mp4"}
READY, RESULT = "@@READY ", "@@RESULT "
ROW_GROUPS = ("loader", "tvl1", "policy", "step", "embed", "search")


@dataclass
class Settings:
    """What one run measures; ``quick`` shrinks every size so that the whole run takes seconds."""

    quick: bool
    rounds: int
    authors: Path | None
    authors_pythonpath: str
    tmp: Path
    rows: tuple[str, ...]
    results: list[dict[str, Any]] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------------------------
# workers: one process per side, set up once, then one timed call per "run" line on stdin


def worker_main(kind: str, config: dict[str, Any]) -> None:
    """Set up ``kind`` with ``config``, warm it up, then answer each ``run`` line with one timing."""
    threads = int(config.get("threads", 1))
    if kind.startswith("authors_"):
        _import_authors(config["authors"], config.get("authors_pythonpath", ""))
    import cv2  # noqa: PLC0415 - after the OpenMP environment is final (set by the parent)
    import torch  # noqa: PLC0415

    torch.set_num_threads(threads)
    cv2.setNumThreads(threads)
    call, info = WORKERS[kind](config)
    info.update(call())
    print(READY + json.dumps(info), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        call()
        print(RESULT + json.dumps(time.perf_counter() - start), flush=True)


def _import_authors(path: str, extra: str) -> None:
    """Put the authors' checkout (and ``extra`` folders) on sys.path of this worker, and make a torchvision
    whose compiled operators cannot load here importable (their loader uses only its PIL transforms)."""
    sys.path[:0] = [p for p in [*extra.split(os.pathsep), path] if p]
    import torch  # noqa: PLC0415

    try:
        import torchvision  # noqa: F401, PLC0415
    except RuntimeError:  # operator torchvision::nms does not exist: its _C library is for another torch build
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        torch.library.register_fake = lambda *args, **kwargs: (lambda fn: fn)
        import torchvision  # noqa: F401, PLC0415


def ours_loader(config: dict[str, Any]) -> tuple[Callable[[], dict], dict]:
    import torch  # noqa: PLC0415

    from coclr.data.augment import ClipAugment  # noqa: PLC0415
    from coclr.data.batch_decode import collate_clips  # noqa: PLC0415
    from coclr.data.datasets import TrainClips  # noqa: PLC0415
    from coclr.train.trainer import train_loader_worker  # noqa: PLC0415

    train_loader_worker()  # what the training loader's workers run first: this worker is one of them
    dataset = TrainClips(config["store"], "train", ["rgb"], config["length"], num_clips=2, seed=0)
    augment = ClipAugment(size=config["size"])
    generator = torch.Generator().manual_seed(0)
    batch, counter = config["batch"], iter(range(10**9))

    def call() -> dict:
        step = next(counter)
        dataset.set_epoch(step)
        clips = collate_clips([dataset[i % len(dataset)] for i in range(batch)])["rgb"]
        outs = [augment({"rgb": clips[:, c]}, generator)["rgb"] for c in range(clips.shape[1])]
        return {"shape": [len(outs), *outs[0].shape]}  # the trainer takes the two clips apart

    return call, {}


def authors_loader(config: dict[str, Any]) -> tuple[Callable[[], dict], dict]:
    import main_nce  # noqa: PLC0415 - from their checkout (sys.path set by _import_authors)
    import torch  # noqa: PLC0415
    from dataset.lmdb_dataset import UCF101LMDB_2CLIP  # noqa: PLC0415

    args = argparse.Namespace(img_dim=config["size"], seq_len=config["length"])
    transform = main_nce.get_transform("train", args)
    dataset = UCF101LMDB_2CLIP(root=config["root"], db_path=config["lmdb"], mode="train", transform=transform,
                               num_frames=config["length"], ds=1, return_label=True)
    batch = config["batch"]

    def call() -> dict:
        samples = [dataset[i % len(dataset)] for i in range(batch)]
        clips = torch.stack([seq for seq, _ in samples])
        return {"shape": list(clips.shape)}

    return call, {}


def _flow_pairs(config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    frames = np.load(config["frames"])
    return frames[:-1], frames[1:]


def ours_tvl1(config: dict[str, Any]) -> tuple[Callable[[], dict], dict]:
    import torch  # noqa: PLC0415

    from coclr.flow.tvl1 import make_passes, tvl1_flow  # noqa: PLC0415

    prev, nxt = (torch.from_numpy(a) for a in _flow_pairs(config))
    kernels = config.get("kernels", "auto")

    def call() -> dict:
        flow = tvl1_flow(prev, nxt, mode="exact", kernels=kernels)
        return {"mean_abs_flow": float(flow.abs().mean())}

    return call, {"kernels": type(make_passes(kernels, prev.device)).__name__}


def opencv_tvl1(config: dict[str, Any]) -> tuple[Callable[[], dict], dict]:
    from coclr.flow.opencv import create_tvl1  # noqa: PLC0415

    prev, nxt = _flow_pairs(config)

    def call() -> dict:
        total = 0.0
        for a, b in zip(prev, nxt):
            total += float(np.abs(create_tvl1(None).calc(a, b, None)).mean())
        return {"mean_abs_flow": total / len(prev)}

    return call, {}


def _step_input(config: dict[str, Any]):
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(1)
    return torch.randn(config["input"], generator=generator)


def _training_step(model, x) -> Callable[[], dict]:
    import torch  # noqa: PLC0415

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    first: list[float] = []

    def call() -> dict:
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        first.append(float(loss.detach()))
        return {"first_loss": first[0]}

    return call


def ours_step(config: dict[str, Any]) -> tuple[Callable[[], dict], dict]:
    from coclr.models.loading import load_encoder  # noqa: PLC0415

    backbone, _ = load_encoder(config["weights"])
    return _training_step(backbone, _step_input(config)), {}


def authors_step(config: dict[str, Any]) -> tuple[Callable[[], dict], dict]:
    import torch  # noqa: PLC0415
    from backbone.s3dg import S3D  # noqa: PLC0415 - from their checkout

    model = S3D()
    model.load_state_dict(torch.load(config["weights"], weights_only=True))
    return _training_step(model, _step_input(config)), {}


def authors_weights(config: dict[str, Any]) -> tuple[Callable[[], dict], dict]:
    """Not timed: writes the authors' S3D initial weights (seed 0) as a bare state dict."""
    import torch  # noqa: PLC0415
    from backbone.s3dg import S3D  # noqa: PLC0415

    torch.manual_seed(0)
    torch.save(S3D().state_dict(), config["weights"])
    return (lambda: {}), {}


WORKERS: dict[str, Callable[[dict[str, Any]], tuple[Callable[[], dict], dict]]] = {
    "ours_loader": ours_loader, "authors_loader": authors_loader, "ours_tvl1": ours_tvl1,
    "opencv_tvl1": opencv_tvl1, "ours_step": ours_step, "authors_step": authors_step,
    "authors_weights": authors_weights}


# ----------------------------------------------------------------------------------------------------------------
# the parent: workers in pairs, A B B A


class Worker:
    """A worker process of one side of a row."""

    def __init__(self, kind: str, config: dict[str, Any], env: dict[str, str]):
        self.kind = kind
        self.process = subprocess.Popen([sys.executable, str(HERE), "--worker", kind, json.dumps(config)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = json.loads(self._read(READY))

    def _read(self, marker: str) -> str:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(marker):
                return line[len(marker):]
        raise RuntimeError(f"worker {self.kind} exited with {self.process.wait()} (its error is printed above)")

    def time(self) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        return float(json.loads(self._read(RESULT)))

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait()


def worker_env(threads: int, policy: bool = True) -> dict[str, str]:
    """The environment of a worker: equal thread settings for both sides, OpenMP's wait policy or its default,
    and ``coclr``'s allocator setting for both sides (huge pages: the authors' code gets them too)."""
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_POLICY}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               **ALLOCATOR_POLICY)
    if policy:
        env.update(OPENMP_POLICY)
    return env


class Spinner:
    """Another process keeping one core busy (a pure-Python loop), for the contention rows."""

    def __enter__(self) -> Spinner:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def compare(settings: Settings, name: str, ours: tuple[str, dict], theirs: tuple[str, dict], threads: int,
            against: str, spin: bool = False, policies: tuple[bool, bool] = (True, True),
            their_threads: int | None = None) -> dict[str, Any]:
    """Time ``ours`` and ``theirs`` (worker kind and config) A B B A; print and record the row. Both sides get
    ``threads`` threads unless ``their_threads`` is given (for comparing our own thread counts)."""
    workers: list[Worker] = []
    sides = zip((ours, theirs), policies, (threads, their_threads or threads))
    try:
        workers = [Worker(kind, {**config, "threads": n}, worker_env(n, policy))
                   for (kind, config), policy, n in sides]
        times: tuple[list[float], list[float]] = ([], [])
        with Spinner() if spin else _nothing():
            for _ in range(settings.rounds):
                for side in (0, 1, 1, 0):
                    times[side].append(workers[side].time())
        infos = [w.info for w in workers]
    finally:
        for worker in workers:
            worker.close()
    ours_t, theirs_t = times
    ratios = [b / a for a, b in zip(ours_t, theirs_t)]
    row = {"row": name, "against": against, "threads": threads, "spinning_process": spin,
           "ours_s": statistics.median(ours_t), "theirs_s": statistics.median(theirs_t),
           "ratio": statistics.median(theirs_t) / statistics.median(ours_t),
           "ratio_min": min(ratios), "ratio_max": max(ratios), "ours_all_s": ours_t, "theirs_all_s": theirs_t,
           "ours_info": infos[0], "theirs_info": infos[1], "load_after": os.getloadavg()[0]}
    settings.results.append(row)
    print(f"{name:<30} {row['ours_s']:9.3f} {row['theirs_s']:9.3f} {row['ratio']:7.2f} "
          f"{row['ratio_min']:6.2f}-{row['ratio_max']:<6.2f} {row['load_after']:5.2f}  {against}", flush=True)
    return row


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def skip(settings: Settings, name: str, why: str) -> None:
    print(f"{name:<30} skipped: {why}", flush=True)
    settings.results.append({"row": name, "skipped": why})


# ----------------------------------------------------------------------------------------------------------------
# data of the rows


def loader_data(settings: Settings) -> dict[str, Any] | str:
    """Our store and the authors' LMDB of the same JPEG frames (real UCF101 clips at 128x171); or why not."""
    try:
        import lmdb  # noqa: PLC0415 - optional: only the authors' format needs it
        import msgpack  # noqa: PLC0415
    except ImportError as error:
        return f"the authors' LMDB format needs {error.name} (pip install lmdb msgpack)"
    from coclr.store.clipstore import create_store, open_store, write_entry  # noqa: PLC0415
    from coclr.store.jpeg import encode_jpeg  # noqa: PLC0415
    from coclr.video.decode import decode_video  # noqa: PLC0415
    from coclr.video.indexes import VideoEntry, VideoIndex  # noqa: PLC0415

    length, size, short_side = (4, 32, 32) if settings.quick else (32, 128, 128)
    names = [Path(n).stem for n in LOADER_CLIPS]
    keys = [f"{name.split('_')[1] if name.startswith('v_') else 'Archery'}/{name}" for name in names]
    root = settings.tmp / "loader"
    store = root / "store"
    classes = sorted({k.split("/")[0] for k in keys})
    create_store(store, VideoIndex("bench", classes, [VideoEntry(k, classes.index(k.split("/")[0]), "train")
                                                      for k in keys]))
    for key, clip in zip(keys, LOADER_CLIPS):
        frames = decode_video(SHARED / "clips" / clip, short_side=short_side)
        write_entry(store, key, "rgb", [encode_jpeg(f) for f in frames], fps=25.0)
    opened = open_store(store)
    # Their format (dataset/convert_video_to_lmdb.py): '%09d' keys -> msgpack list of JPEG bytes, plus
    # __keys__, __len__, __order__ (names as bytes: their loader calls .decode() on them), and their split CSV.
    env = lmdb.open(str(root / "frames.lmdb"), map_size=2**31)
    with env.begin(write=True) as txn:
        for i, key in enumerate(keys):
            blobs = opened.read_encoded(key, "rgb", range(opened.num_frames(key, "rgb")))
            txn.put(f"{i:09d}".encode(), msgpack.dumps(blobs))
        txn.put(b"__keys__", msgpack.dumps([f"{i:09d}".encode() for i in range(len(keys))]))
        txn.put(b"__len__", msgpack.dumps(len(keys)))
        txn.put(b"__order__", msgpack.dumps([k.encode() for k in keys]))
    env.close()
    (root / "ClassInd.txt").write_text("".join(f"{i + 1},{c}\n" for i, c in enumerate(classes)))
    (root / "train_split01.csv").write_text("".join(f"/frames/{k}/,{opened.num_frames(k, 'rgb')}\n" for k in keys))
    batch = 2 if settings.quick else 8
    return {"store": str(store), "root": str(root), "lmdb": str(root / "frames.lmdb"), "length": length,
            "size": size, "batch": batch, "frame_size": list(opened.frame_size(keys[0], "rgb"))}


def flow_frames(settings: Settings, short_side: int, pairs: int) -> str:
    """A ``.npy`` of ``pairs + 1`` consecutive grayscale frames (decoded from JPEG, as our store holds them)."""
    from coclr.flow.opencv import rgb_to_gray  # noqa: PLC0415
    from coclr.store.jpeg import decode_jpeg, encode_jpeg  # noqa: PLC0415
    from coclr.video.decode import decode_video  # noqa: PLC0415

    path = settings.tmp / f"flow{short_side}_{pairs}.npy"
    if not path.exists():
        frames = decode_video(SHARED / "clips" / FLOW_CLIPS[256 if short_side >= 256 else 128],
                              short_side=short_side)
        start = len(frames) // 2
        rgb = np.stack([decode_jpeg(encode_jpeg(f)) for f in frames[start : start + pairs + 1]])
        np.save(path, np.ascontiguousarray(rgb_to_gray(rgb)))
    return str(path)


# ----------------------------------------------------------------------------------------------------------------
# the rows


def loader_rows(settings: Settings) -> None:
    name = "loader, 1 core"
    if settings.authors is None:
        return skip(settings, name, "no authors' checkout (--authors PATH or COCLR_AUTHORS)")
    data = loader_data(settings)
    if isinstance(data, str):
        return skip(settings, name, data)
    theirs = {**data, "authors": str(settings.authors), "authors_pythonpath": settings.authors_pythonpath}
    compare(settings, name, ("ours_loader", data), ("authors_loader", theirs), 1,
            f"authors' UCF101LMDB_2CLIP + get_transform, batch {data['batch']} x 2 clips x {data['length']} "
            f"frames {data['frame_size'][0]}x{data['frame_size'][1]} -> {data['size']}")


def tvl1_rows(settings: Settings) -> None:
    sizes = {32: 1} if settings.quick else {128: 4, 256: 2}
    for short_side, pairs in sizes.items():
        config = {"frames": flow_frames(settings, short_side, pairs)}
        shape = np.load(config["frames"], mmap_mode="r").shape
        for threads, spin in ([(1, False)] if settings.quick else [(1, False), (2, False), (2, True)]):
            label = f"tvl1 {shape[1]}x{shape[2]} {threads}t" + (" +spin" if spin else "")
            row = compare(settings, label, ("ours_tvl1", config), ("opencv_tvl1", config), threads,
                          f"OpenCV DualTVL1OpticalFlow, same parameters, {pairs} pairs", spin=spin)
        print(f"{'':<30} ours ran {row['ours_info']['kernels']}; mean |flow| ours "
              f"{row['ours_info']['mean_abs_flow']:.4f}, OpenCV {row['theirs_info']['mean_abs_flow']:.4f}", flush=True)
    if not settings.quick:
        config = {"frames": flow_frames(settings, 256, 2)}
        compare(settings, "tvl1 256x340 1t, C vs torch", ("ours_tvl1", config),
                ("ours_tvl1", {**config, "kernels": "torch"}), 1,
                "our TV-L1 with PyTorch operations (kernels='torch'), 2 pairs")


def policy_rows(settings: Settings) -> None:
    """Our 2-thread TV-L1 under a spinning process: passive wait policy (ours) against OpenMP's default."""
    short_side, pairs = (32, 1) if settings.quick else (256, 2)
    config = {"frames": flow_frames(settings, short_side, pairs)}
    compare(settings, "wait policy, tvl1 2t +spin", ("ours_tvl1", config), ("ours_tvl1", config), 2,
            "our TV-L1 with OpenMP's default (active) wait policy", spin=True, policies=(True, False))
    compare(settings, "2 threads vs 1, tvl1 +spin", ("ours_tvl1", config), ("ours_tvl1", config), 2,
            "our TV-L1 on 1 thread (both under the spinning process, passive policy)", spin=True, their_threads=1)


def step_rows(settings: Settings) -> None:
    name = "s3d step, 1 thread"
    if settings.authors is None:
        return skip(settings, name, "no authors' checkout (--authors PATH or COCLR_AUTHORS)")
    weights = settings.tmp / "s3d_authors.pt"
    config = {"weights": str(weights), "authors": str(settings.authors),
              "authors_pythonpath": settings.authors_pythonpath,
              "input": [2, 3, 8, 64, 64] if settings.quick else [4, 3, 16, 112, 112]}
    Worker("authors_weights", config, worker_env(1)).close()
    row = compare(settings, name, ("ours_step", config), ("authors_step", config), 1,
                  f"authors' backbone/s3dg.py S3D, same weights, input {'x'.join(map(str, config['input']))}")
    losses = (row["ours_info"]["first_loss"], row["theirs_info"]["first_loss"])
    print(f"{'':<30} first losses: ours {losses[0]:.9g}, theirs {losses[1]:.9g}", flush=True)


QUICK_SIZES: dict[str, dict[str, Any]] = {
    "embed": {"width": 0.125, "threads": (1,)},
    "search": {"rows": 2_000, "dim": 64, "queries": 10},
}
"""What ``--quick`` gives another benchmark's ``compare_<group>`` (each as its parameters name it): tiny sizes."""


def imported_rows(settings: Settings, group: str, load: Callable[[], Any]) -> None:
    """Rows of another benchmark's ``compare_<group>`` (benchmarks/bench_<group>.py, imported by ``load``), when it
    defines one."""
    try:
        module = load()
    except ImportError as error:
        return skip(settings, group, f"benchmarks/bench_{group}.py does not import ({error})")
    function = getattr(module, f"compare_{group}", None)
    if function is None:
        return skip(settings, group, f"benchmarks/bench_{group}.py defines no compare_{group}() yet")
    taken = inspect.signature(function).parameters
    wanted = {"repeats": settings.rounds, "quick": settings.quick, **(QUICK_SIZES.get(group, {}) if settings.quick
                                                                      else {})}
    rows = function(**{key: value for key, value in wanted.items() if key in taken})
    for row in rows:
        row.setdefault("row", f"{group} {row['threads']} thread(s)" if "threads" in row else group)
        settings.results.append(row)
        ratio = row.get("ratio")
        against = row.get("against") or " vs ".join(str(row[key]) for key in ("path", "compared_with") if key in row)
        print(f"{str(row['row']):<30} {row.get('ours_s', float('nan')):9.3f} {row.get('theirs_s', float('nan')):9.3f} "
              f"{ratio if ratio is not None else float('nan'):7.2f} {'':13} {os.getloadavg()[0]:5.2f}  "
              f"{against}", flush=True)
        if "first_pass" in row:
            print(f"{'':<30} our first pass: {row['first_pass']} (int8 kernel: {row.get('int8_kernel')})", flush=True)


ROWS: dict[str, Callable[[Settings], None]] = {
    "loader": loader_rows, "tvl1": tvl1_rows, "policy": policy_rows, "step": step_rows,
    "embed": lambda s: imported_rows(s, "embed", lambda: importlib.import_module("bench_embed")),
    "search": lambda s: imported_rows(s, "search", lambda: importlib.import_module("bench_search"))}


def profile(row: str, quick: bool) -> None:
    """Where our side of ``row`` spends its time: cProfile of one call after a warm-up, on 1 thread."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    import cv2  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(quick, 1, None, "", Path(tmp), (row,))
        if row == "loader":
            config = loader_data(settings)
            if isinstance(config, str):
                raise SystemExit(config)
            call, _ = ours_loader(config)
        else:
            call, _ = ours_tvl1({"frames": flow_frames(settings, 32 if quick else 128, 1 if quick else 4)})
        call()
        profiler = cProfile.Profile()
        profiler.runcall(call)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def limit_cpu(kind: str) -> None:
    """Run this command again with the kernels limited to ``kind`` (``avx2``: :data:`coclr.cpu.AVX2_LIMIT`), so
    that the libraries read the limits when they load, here and in every worker; nothing when they are set."""
    if kind == "native" or limits() == AVX2_LIMIT:
        return
    os.execve(sys.executable, [sys.executable, str(HERE), *sys.argv[1:]], {**os.environ, **AVX2_LIMIT})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes and one round: seconds, for CI")
    parser.add_argument("--rounds", type=int, default=None, help="A B B A rounds per row (default 3, quick 1)")
    parser.add_argument("--authors", default=os.environ.get("COCLR_AUTHORS"),
                        help="checkout of the authors' code (TengdaHan/CoCLR); default $COCLR_AUTHORS")
    parser.add_argument("--authors-pythonpath", default=os.environ.get("COCLR_AUTHORS_PYTHONPATH", ""),
                        help="extra folders for the authors' workers only (their dependencies)")
    parser.add_argument("--rows", default=",".join(ROW_GROUPS), help=f"row groups, of {', '.join(ROW_GROUPS)}")
    parser.add_argument("--json", default="compare.json", help="where the results are written")
    parser.add_argument("--profile", choices=("loader", "tvl1"),
                        help="instead of the table: profile our side of a row in this process (cProfile, 1 thread)")
    parser.add_argument("--cpu", choices=("native", "avx2"), default="native",
                        help="native: this CPU as is; avx2: every library's kernels limited to AVX2 (an emulation "
                        "of the AVX2-only CPU kind: coclr.cpu.AVX2_LIMIT)")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args.worker[0], json.loads(args.worker[1]))
    if args.profile:
        return profile(args.profile, args.quick)
    rows = tuple(r for r in args.rows.split(",") if r)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)} (choose from {', '.join(ROW_GROUPS)})")
    authors = Path(args.authors) if args.authors else None
    if authors is not None and not (authors / "main_nce.py").is_file():
        parser.error(f"--authors {authors}: no main_nce.py there (expected a checkout of TengdaHan/CoCLR)")
    if not SHARED.is_dir():
        parser.error(f"real clips not found at {SHARED} (set COCLR_SHARED to the folder holding data/)")
    limit_cpu(args.cpu)
    import torch  # noqa: PLC0415 - after the limits are in the environment (its capability is printed)

    started, load_before = time.time(), os.getloadavg()
    print(f"{describe()}; torch {torch.__version__}; Python {platform.python_version()}; "
          f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    print("ratio = their median time / our median time (> 1: we are faster); spread = min-max of the A B B A "
          "pair ratios; load = 1-minute load average after the row")
    print(f"{'row':<30} {'ours s':>9} {'theirs s':>9} {'ratio':>7} {'spread':<13} {'load':>5}  compared with")
    try:  # before the rows, not after minutes of them
        check_writable(args.json, kind="file")
    except FolderRefused as error:
        parser.error(f"--json: {error}")
    try:  # before the rows, not after minutes of them
        check_writable(args.json, kind="file")
    except FolderRefused as error:
        parser.error(f"--json: {error}")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(args.quick, args.rounds or (1 if args.quick else 3), authors, args.authors_pythonpath,
                            Path(tmp), rows)
        for group in rows:
            ROWS[group](settings)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
          f"{time.time() - started:.0f} s")
    report = {"cpu": cpu_model(), "cpu_line": describe(), "flags": sorted(cpu_flags()), "limits": limits(),
              "torch_capability": torch.backends.cpu.get_cpu_capability(), "native_bfloat16": native_bfloat16(),
              "cores": os.cpu_count(), "load_before": load_before, "load_after": load_after,
              "quick": args.quick, "rounds": settings.rounds, "command": " ".join(sys.argv),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "rows": settings.results}
    atomic_write_json(args.json, report)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
