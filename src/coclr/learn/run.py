"""``coclr learn``: a folder of one's own videos, no labels, into encoders, embeddings and a report page.

One command runs the paper's algorithm on the footage, sized to a wall-clock budget on this machine
(:mod:`coclr.learn.budget`): the videos are decoded once into a clip store (``OUT/store``), their TV-L1 flow is
extracted into it, InfoNCE trains an encoder of each view and two cycles of CoCLR co-train them
(``OUT/pipeline``, :mod:`coclr.learn.recipe`); the final encoders are written as ``OUT/encoder_rgb.pth`` and
``OUT/encoder_flow.pth`` (what ``coclr embed`` and :func:`coclr.load_encoder` take), every video is embedded with
them into ``OUT/embeddings/{rgb,flow,two_stream}`` (``coclr embed`` folders that ``coclr search`` reads), each
stage's encoder is judged without labels (:mod:`coclr.eval.label_free`), and ``OUT/report.html`` shows it all.
``OUT/learn.json`` records the plan, the time of each phase, the quality of each stage and, with ``labels``
(never used to train), the kNN accuracy and R@k of the labelled videos.

The rule of every long command: the same command continues where it stopped (each part resumes on its own), the
same folder with other videos or options is refused before any work naming what differs, and a finished run
returns at once without writing anything. Unreadable videos are listed and left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coclr import progress
from coclr.atomic import atomic_write_json, atomic_write_text, read_json_record
from coclr.config import from_dict
from coclr.embed.inputs import expand_inputs
from coclr.errors import CoclrError, ConfigError, DataError
from coclr.learn.budget import Footage, Plan, choose_plan, infonce_side_by_side, measure_costs
from coclr.learn.recipe import pipeline_options
from coclr.runfolder import FolderRule, check_folder, claim_folder, read_record
from coclr.video.indexes import unlabelled_index

LEARN_FOLDER = FolderRule("learn", "a learn run", may_differ=("labels", "device", "workers"), restart=True)
"""How a learn folder is continued or refused (:mod:`coclr.runfolder`): the videos, the budget and the seed
decide what it holds; the labels (only scored), the device and the workers may change."""
INPUTS_FILE = "inputs.json"
PLAN_FILE = "plan.json"
RESULT_FILE = "learn.json"
LOG_FILE = "learn.log"
EMBEDDINGS = ("rgb", "flow", "two_stream")
VIEWS = ("rgb", "flow")


@dataclasses.dataclass
class LearnOptions:
    """What a run is asked for (``budget`` in seconds; ``device`` None: CUDA when present; ``workers`` None: one
    per core)."""

    budget: float = 900.0
    seed: int = 0
    labels: str | None = None
    device: str | None = None
    workers: int | None = None
    restart: bool = False
    progress: bool = True
    plan: Plan | None = None
    """a plan to follow instead of measuring this machine and choosing one (for tests, or a plan chosen before)"""


@dataclasses.dataclass
class LearnSummary:
    """What a run did: where, the videos learnt from and those left out (path, reason), the seconds it took
    (this time, and in all), and whether it had finished before (nothing done)."""

    out: Path
    videos: int
    failed: list[tuple[str, str]]
    seconds: float
    already_done: bool = False
    record: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = []
        if self.already_done:
            lines.append(f"{self.out}: finished before; nothing to do")
        else:
            learnt = self.videos - len(self.failed)
            lines.append(f"{self.out}: learnt from {learnt} videos in {progress.duration(self.seconds)}")
        lines.append(f"  encoders: {self.out / 'encoder_rgb.pth'}, {self.out / 'encoder_flow.pth'}")
        lines.append(f"  embeddings: {', '.join(str(self.out / 'embeddings' / name) for name in EMBEDDINGS)} "
                     f"(coclr search {self.out / 'embeddings' / 'two_stream'} --query VIDEO)")
        lines.append(f"  report: {self.out / 'report.html'}; every figure in {self.out / RESULT_FILE}")
        for name, scores in (self.record.get("labels") or {}).get("embeddings", {}).items():
            lines.append(f"  with the given labels, {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in scores.items()
                                                                       if isinstance(v, float)))
        collapsed = [stage for stage, entry in self.record.get("stages", {}).items() if entry.get("collapsed")]
        if collapsed:
            lines.append(f"  collapsed (features without spread): {', '.join(collapsed)}; their encoders carry "
                         "nothing")
        if self.failed:
            lines.append(f"  {len(self.failed)} video(s) could not be read and were left out:")
            lines += [f"    {message}" for _, message in self.failed[:20]]
            if len(self.failed) > 20:
                lines.append(f"    ... and {len(self.failed) - 20} more, listed in {self.out / RESULT_FILE}")
        return "\n".join(lines)


def paths_digest(paths: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(paths).encode()).hexdigest()


def learn(inputs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
          options: LearnOptions | None = None) -> LearnSummary:
    """Learn from the videos named by ``inputs`` (:func:`~coclr.embed.inputs.expand_inputs`: files, folders,
    list files, globs) into the folder ``out`` (see the module docstring). Raises a
    :class:`~coclr.errors.CoclrError` in one line before any work for bad inputs or options, a folder of other
    videos or options, or a budget too small."""
    options = options or LearnOptions()
    started = time.perf_counter()
    out = Path(out)
    notes: list[str] = []
    paths = [str(path) for path in expand_inputs(inputs, notes)]
    check_inputs(out, paths, options.restart)
    labels = read_labels(options.labels, paths) if options.labels else None
    record_options = {"videos": {"count": len(paths), "sha256": paths_digest(paths)},
                      "budget": float(options.budget), "seed": options.seed,
                      "labels": options.labels and os.path.abspath(options.labels), "device": options.device,
                      "workers": options.workers}
    if not options.restart and check_folder(out, LEARN_FOLDER, record_options):  # reads only
        result = read_result(out)
        if result.get("status") == "done" and result.get("labels_file") == record_options["labels"]:
            failed = [(item["path"], item["error"]) for item in result.get("failed", [])]
            return LearnSummary(out, len(paths), failed, time.perf_counter() - started, True, result)
    from coclr.distributed import (  # noqa: PLC0415 (heavy: torch)
        barrier,
        broadcast_object,
        init_distributed,
        launched_rank,
        pick_device,
    )

    device = pick_device(options.device)
    with contextlib.ExitStack() as held:
        refused, plan = None, None
        if launched_rank() == 0:  # makes the plan and holds the folder before the other processes join it
            try:
                plan = (None if options.restart else read_plan(out)) or options.plan or make_plan(
                    paths, options.budget, device, options.workers, time.perf_counter() - started)
                held.enter_context(claim_folder(out, LEARN_FOLDER, record_options, restart=options.restart))
                record_start(out, paths, notes, plan)
            except CoclrError as error:
                refused = error
        init_distributed(device)  # under torchrun the other processes wait here for rank 0
        message, plan = broadcast_object((None if refused is None else str(refused), plan))
        if message is not None:
            raise refused if refused is not None else ConfigError(message)
        summary = _learn(out, paths, labels, options, plan, device, started)
        barrier()
    return summary


def record_start(out: Path, paths: list[str], notes: list[str], plan: Plan) -> None:
    """Write what a run follows, once: its inputs and its plan (the plan is made before the folder is claimed, so
    that a refused budget leaves no folder behind)."""
    for note in notes:
        say(note)
    if not (out / INPUTS_FILE).is_file():
        atomic_write_json(out / INPUTS_FILE, {"videos": paths})
    if not (out / PLAN_FILE).is_file():
        atomic_write_json(out / PLAN_FILE, plan.to_dict())


def _learn(out: Path, paths: list[str], labels: dict[str, Any] | None, options: LearnOptions, plan: Plan, device,
           started: float) -> LearnSummary:
    """Every phase; the parts run by every process of a torchrun job, what is written once by rank 0."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.distributed import barrier, is_main, world_size  # noqa: PLC0415 (heavy: torch)
    from coclr.train.pipeline import plan_stages, run_pipeline  # noqa: PLC0415

    main = is_main()
    result = read_result(out) if main else {}
    if main:
        say(plan.describe())
    result["status"] = "running"
    line = ProgressLine(plan.estimates, enabled=options.progress and main)
    log = open(out / LOG_FILE if main else os.devnull, "a")  # the parts' lines go to the log, not the terminal
    with log, line, progress.observed(line.observe), contextlib.redirect_stdout(log):
        record = (lambda name: timed(out, result, name)) if main else (lambda name: contextlib.nullcontext())
        root = common_root(paths)
        with line.phase("store", len(paths)), record("store"):
            store = build_learn_store(out, root, paths, plan, options.workers)
        with line.phase("flow", len(paths)), record("flow"):
            flow_failed = extract_learn_flow(store, root, options.workers)
        config = pipeline_config(out, store, plan, options.seed, str(device), usable_videos(store), world_size())
        side_by_side = infonce_side_by_side(device, world_size())
        infonce = plan_stages(config)[:2]
        units = sum(stage.epochs for stage in infonce) if side_by_side else plan.steps // 2
        with line.phase("infonce", units), record("infonce"):
            if side_by_side:
                train_side_by_side(out, config, infonce)
            run_pipeline(config, until=infonce[-1].name)
        with line.phase("coclr", plan.steps - plan.steps // 2), record("coclr"):
            run_pipeline(config)
        if main:
            export_encoders(out, config)
        barrier()
        with line.phase("embed", 2 * len(paths)), record("embed"):
            embed_failed = embed_all(out, paths, str(device), options.workers)
        if not main:
            return LearnSummary(out, len(paths), [], time.perf_counter() - started)
        with line.phase("quality", None), record("quality"):
            result["stages"], result["agreement"] = stage_quality(out, store, config, str(device))
            result["embeddings"] = embedding_quality(out)
        if labels is not None:
            from coclr.learn.scores import label_scores  # noqa: PLC0415

            result["labels"] = label_scores(out, labels)
        failed = sorted({**store_failures(store, root), **flow_failed, **embed_failed}.items())
        result.update(status="done", plan=plan.to_dict(), labels_file=labels and labels["file"],
                      failed=[{"path": path, "error": error} for path, error in failed],
                      videos=len(paths), torch=torch.__version__)
        result["seconds"] = result.get("seconds", 0.0) + time.perf_counter() - started
        with line.phase("fixed", None):
            from coclr.learn.report import write_report  # noqa: PLC0415

            write_report(out / "report.html", out, result, paths)
        atomic_write_json(out / RESULT_FILE, result)
    return LearnSummary(out, len(paths), failed, time.perf_counter() - started, record=result)


# ------------------------------------------------------------------------------------------------ the parts


def say(text: str) -> None:
    """A line for the person running the command (never into the log the parts write to)."""
    progress.write(text, file=sys.__stdout__)


@contextlib.contextmanager
def timed(out: Path, result: dict[str, Any], name: str) -> Iterator[None]:
    """Add the seconds of the block to ``result["phases"][name]`` and record them in ``learn.json`` (a resumed run
    adds to what the earlier ones took)."""
    begin = time.perf_counter()
    try:
        yield
    finally:
        phases = result.setdefault("phases", {})
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - begin
        atomic_write_json(out / RESULT_FILE, result)


def read_result(out: Path) -> dict[str, Any]:
    """What the run in ``out`` has finished so far (``learn.json``), empty before its first part."""
    return read_json_record(out / RESULT_FILE) or {}


def read_plan(out: Path) -> Plan | None:
    """The plan the run in ``out`` chose (``plan.json``), None before it chose one."""
    record = read_json_record(out / PLAN_FILE)
    return None if record is None else Plan.from_dict(record)


def check_inputs(out: Path, paths: list[str], restart: bool) -> None:
    """Refuse a folder that learnt from other videos, naming those added and removed (before any work)."""
    record = read_record(out) if out.is_dir() else None
    inputs = out / INPUTS_FILE
    if restart or record is None or record.get("command") != LEARN_FOLDER.command or not inputs.is_file():
        return
    before = (read_json_record(inputs) or {}).get("videos")
    if before == paths:
        return
    added = [p for p in paths if p not in set(before)]
    removed = [p for p in before if p not in set(paths)]
    parts = [f"{len(added)} added ({', '.join(added[:3])}{' ...' if len(added) > 3 else ''})" if added else "",
             f"{len(removed)} removed ({', '.join(removed[:3])}{' ...' if len(removed) > 3 else ''})"
             if removed else "", "in another order" if not added and not removed else ""]
    raise ConfigError(f"{out} learnt from other videos: {'; '.join(p for p in parts if p)}; give the same videos to "
                      f"continue it, another --out, or --restart to move it aside and start over")


def make_plan(paths: list[str], budget: float, device, workers: int | None, spent: float) -> Plan:
    """Probe the videos, measure this machine and choose the plan (:mod:`coclr.learn.budget`) for the processes
    and machines of the job."""
    from coclr.distributed import launched_machines, launched_world_size  # noqa: PLC0415 (heavy: torch)
    from coclr.video.decode import probe_video  # noqa: PLC0415

    say(f"coclr learn: probing {len(paths)} videos and measuring this machine for the budget ...")
    begin = time.perf_counter()
    infos = []
    for path in paths:
        try:
            infos.append(probe_video(path))
        except Exception:  # an unreadable video is the store job's failure, listed there
            continue
    if not infos:
        raise DataError("none of the videos could be read (not a video, or damaged): check the inputs")
    footage = Footage.of(infos)
    workers = job_workers(workers)
    spent += time.perf_counter() - begin
    costs = measure_costs(paths, footage, device, workers, budget - spent, launched_world_size(), launched_machines())
    return choose_plan(footage, costs, budget, spent + costs.seconds)


def job_workers(workers: int | None) -> int:
    """Processes of the store and flow jobs: as given, else one per core."""
    return max(1, workers if workers is not None else (os.cpu_count() or 1))


def common_root(paths: list[str]) -> str:
    """The deepest folder holding every path."""
    return os.path.commonpath([os.path.dirname(path) for path in paths])


def build_learn_store(out: Path, root: str, paths: list[str], plan: Plan, workers: int | None) -> Path:
    """The clip store ``OUT/store`` of the videos (no labels; keys relative to ``root``): frames at the plan's clip
    side."""
    from coclr.store.build import build_store  # noqa: PLC0415 (heavy: torch)

    index = unlabelled_index([os.path.relpath(path, root).replace(os.sep, "/") for path in paths], out.name)
    store = out / "store"
    summary = build_store(index, root, store, short_side=plan.model.size, workers=workers)
    print(summary, flush=True)
    return store


def store_failures(store: Path, root: str) -> dict[str, str]:
    """The videos the store could not decode or compute flow for (path -> reason)."""
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    clip_store = ClipStore(store)
    failed = {**clip_store.failed("flow"), **clip_store.failed("rgb")}
    return {os.path.join(root, key): reason for key, reason in failed.items()}


def extract_learn_flow(store: Path, root: str, workers: int | None) -> dict[str, str]:
    """TV-L1 flow of every stored video (the fastest exact TV-L1 here: our C loops, Triton on a GPU; clipped to the
    paper's bound); returns the videos it failed for (path -> reason)."""
    from coclr.store.flow_extract import extract_flow  # noqa: PLC0415 (heavy: torch)

    summary = extract_flow(store, backend="auto", workers=workers)
    print(summary, flush=True)
    return {os.path.join(root, key): reason for key, reason in summary.failed}


def usable_videos(store: Path) -> int:
    from coclr.data.datasets import usable_entries  # noqa: PLC0415 (heavy: torch)
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    return len(usable_entries(ClipStore(store), "train", list(VIEWS))[0])


def pipeline_config(out: Path, store: Path, plan: Plan, seed: int, device: str, videos: int, processes: int):
    """The pipeline of the plan (``OUT/pipeline``): InfoNCE on both views, then two CoCLR cycles, by ``processes``
    processes."""
    from coclr.train.config import PipelineConfig  # noqa: PLC0415 (heavy: torch)

    return from_dict(PipelineConfig, pipeline_options(plan, str(store), str(out / "pipeline"), seed, device, videos,
                                                      processes))


def train_side_by_side(out: Path, config, stages) -> None:
    """Train the InfoNCE ``stages`` at once, each a ``coclr pretrain`` child process on its share of the cores (as a
    study runs them: the pipeline then finds them done), their output in ``OUT/logs``."""
    import yaml  # noqa: PLC0415

    from coclr.config import to_dict  # noqa: PLC0415
    from coclr.study.plan import Job  # noqa: PLC0415 (heavy: torch)
    from coclr.study.scheduler import run_jobs  # noqa: PLC0415
    from coclr.train.pipeline import stage_config  # noqa: PLC0415

    jobs = []
    for stage in stages:
        options = to_dict(stage_config(config, stage, Path(config.run.out)))
        options["run"]["progress"] = False
        path = out / "configs" / f"{stage.name}.yaml"
        path.parent.mkdir(exist_ok=True)
        atomic_write_text(path, yaml.safe_dump(options, sort_keys=False))
        jobs.append(Job(stage.name, ["pretrain", "--config", str(path)], (), stage.epochs,
                        (Path(config.run.out) / stage.name,)))
    run_jobs(jobs, out, processes=len(jobs), desc="InfoNCE")


def final_encoders(out: Path, config) -> dict[str, Path]:
    """The encoder of each view of the pipeline's last stage that trained it."""
    from coclr.train.pipeline import encoder_file, plan_stages  # noqa: PLC0415

    latest = {}
    for stage in plan_stages(config):
        for view in stage.trains:
            latest[view] = encoder_file(out / "pipeline", stage.name, view)
    return latest


def export_encoders(out: Path, config) -> None:
    """``OUT/encoder_<view>.pth``: the final encoders, copied atomically."""
    for view, source in final_encoders(out, config).items():
        target = out / f"encoder_{view}.pth"
        if target.is_file() and target.read_bytes() == source.read_bytes():
            continue
        temp = target.with_name(f".{target.name}.partial")
        shutil.copyfile(source, temp)
        os.replace(temp, target)


def embed_all(out: Path, paths: list[str], device: str, workers: int | None) -> dict[str, str]:
    """Every video embedded with the final encoders: RGB alone, then both streams in one pass that also writes the
    flow stream alone (the paper's two-stream retrieval, flow computed once); returns the videos that could not be
    embedded (path -> reason)."""
    from coclr.embed.embedder import Embedder  # noqa: PLC0415 (heavy: torch)
    from coclr.embed.run import embed_videos  # noqa: PLC0415

    rgb, flow = out / "encoder_rgb.pth", out / "encoder_flow.pth"
    failed: dict[str, str] = {}
    rgb_alone = Embedder(rgb, device=device, workers=workers)
    summary = embed_videos(paths, out / "embeddings" / "rgb", rgb_alone, progress=False)
    print(summary, flush=True)
    failed.update(dict(summary.failed))
    both = Embedder(rgb, device=device, workers=workers, flow_checkpoint=flow)
    flow_alone = Embedder(flow, device=device, workers=workers)
    summary = embed_videos(paths, out / "embeddings" / "two_stream", both, progress=False,
                           streams={1: (out / "embeddings" / "flow", flow_alone)})
    print(summary, flush=True)
    failed.update(dict(summary.failed))
    return failed


def stage_quality(out: Path, store: Path, config, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The label-free measures of every stage's encoder on the stored videos (a sample of large footage), and the
    agreement of the RGB and flow encoders' nearest neighbours after InfoNCE and after each cycle."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.eval.features import ClipConfig, window_features  # noqa: PLC0415
    from coclr.eval.label_free import neighbour_agreement, quality  # noqa: PLC0415
    from coclr.learn.budget import QUALITY_VIDEOS  # noqa: PLC0415
    from coclr.models.loading import load_encoder  # noqa: PLC0415
    from coclr.train.pipeline import encoder_file, plan_stages  # noqa: PLC0415

    keys = sample_keys(store, QUALITY_VIDEOS)
    clips = ClipConfig(length=config.data.length, stride=config.data.stride, size=config.data.size, batch_size=32)
    stages: dict[str, Any] = {}
    means: dict[str, np.ndarray] = {}
    latest: dict[str, str] = {}
    agreement: dict[str, Any] = {}
    for stage in plan_stages(config):
        for view in stage.trains:
            backbone, _ = load_encoder(encoder_file(out / "pipeline", stage.name, view))
            backbone.eval()
            with torch.inference_mode():
                windows, videos, names = window_features(backbone, store, view, "train", clips, device, keys)
            per_video = np.stack([windows[videos == v].mean(axis=0) for v in range(len(names))])
            stages[stage.name] = {"view": view, "method": stage.method, **quality(per_video, windows, videos)}
            means[stage.name] = per_video
            latest[view] = stage.name
        if set(latest) == set(VIEWS) and (stage.name.startswith("infonce_") or stage.trains == [VIEWS[1]]):
            name = "infonce" if stage.method == "infonce" else f"cycle{stage.cycle}"
            agreement[name] = {"stages": [latest["rgb"], latest["flow"]],
                               "nearest_neighbour": neighbour_agreement(means[latest["rgb"]], means[latest["flow"]]),
                               "chance": 1.0 / max(1, len(keys) - 1)}
    return stages, agreement


def sample_keys(store: Path, count: int) -> list[str]:
    """Up to ``count`` of the store's usable videos, spread evenly over its index (all of smaller footage)."""
    from coclr.data.datasets import usable_entries  # noqa: PLC0415 (heavy: torch)
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    entries = usable_entries(ClipStore(store), "train", list(VIEWS))[0]
    picked = np.unique(np.linspace(0, len(entries) - 1, min(count, len(entries))).round().astype(int))
    return [entries[i].path for i in picked]


def embedding_quality(out: Path) -> dict[str, Any]:
    """The label-free measures of each embedding folder's video vectors."""
    from coclr.embed.search import Embeddings  # noqa: PLC0415 (heavy: torch)
    from coclr.eval.label_free import quality  # noqa: PLC0415

    found = {}
    for name in EMBEDDINGS:
        vectors = np.asarray(Embeddings(out / "embeddings" / name).videos)
        found[name] = quality(vectors)
    return found


def read_labels(path: str, paths: list[str]) -> dict[str, Any]:
    """The labels of ``path`` (a ``--format csv`` manifest ``path,label[,split[,group]]``, paths relative to its
    folder) for the input videos they name: ``{"file", "classes", "videos": {absolute path: (label, split)}}``.
    Refused in one line when it names none of them."""
    from coclr.video.indexes import csv_index  # noqa: PLC0415

    index = csv_index(path)
    folder = os.path.dirname(os.path.abspath(path))
    wanted = set(paths)
    videos = {}
    for entry in index.entries:
        full = os.path.abspath(os.path.join(folder, entry.path))
        if entry.label is not None and full in wanted:
            videos[full] = (entry.label, entry.split)
    if not videos:
        raise DataError(f"--labels {path}: none of its labelled videos is among the inputs (its paths are taken "
                        f"from its folder, {folder})")
    return {"file": os.path.abspath(path), "classes": index.classes, "videos": videos}


# ------------------------------------------------------------------------------------------------ progress


class ProgressLine:
    """One line for the whole job: each phase advances it by its estimated seconds (:class:`~.budget.Plan`) as its
    parts' bars report (:mod:`coclr.progress`), so its ETA is the estimate scaled by the speed so far.

    State: the tqdm line, the current phase, its units (bar updates it expects; None: it only ends), and the
    seconds credited to it so far."""

    def __init__(self, estimates: dict[str, float], enabled: bool = True) -> None:
        self.estimates = dict(estimates)
        self.enabled = enabled
        self.bar = None
        self.current: str | None = None
        self.units: int | None = None
        self.credited = 0.0

    def __enter__(self) -> ProgressLine:
        from tqdm import tqdm  # noqa: PLC0415

        self.bar = tqdm(total=round(sum(self.estimates.values()), 1), disable=not self.enabled, file=sys.__stderr__,
                        bar_format="coclr learn: {desc} {percentage:3.0f}%|{bar:20}| {elapsed} so far, about "
                        "{remaining} left", dynamic_ncols=True, smoothing=0.0)
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()

    @contextlib.contextmanager
    def phase(self, name: str, units: int | None) -> Iterator[None]:
        """Run a phase: its parts' updates advance the line by its estimate per unit; at its end the line stands
        at the phase's full estimate (a resumed phase has less to do)."""
        self.current, self.units, self.credited = name, units, 0.0
        self.bar.set_description_str(name, refresh=True)
        yield
        self._credit(self.estimates.get(name, 0.0) - self.credited)
        self.current = None

    def observe(self, desc: str, count: int, total: int | None) -> None:
        if self.current is None or not self.units:
            return
        share = self.estimates.get(self.current, 0.0) * count / self.units
        self._credit(min(share, self.estimates.get(self.current, 0.0) - self.credited))

    def _credit(self, seconds: float) -> None:
        if seconds > 0:
            self.credited += seconds
            self.bar.update(seconds)
