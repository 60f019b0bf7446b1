"""The paper's algorithm end to end in one run folder: InfoNCE on both views, then cycles of co-training.

Each CoCLR stage trains one view, initialised from that view's last stage, with positives mined by the
frozen other view's latest encoder (``mode=alternate``); ``mode=sim`` trains both views at once, each mining
for the other. ``pipeline.miner`` fixes the encoder that mines for the second view (a checkpoint of the first):
only the second view's CoCLR stages are trained, each mined by that checkpoint. ``manifest.json`` lists the
stages, their status and checkpoints; running the same command again skips finished stages and resumes the
unfinished one from its last checkpoint. A caller may size the stages itself (:func:`run_pipeline`'s ``stages``:
``coclr learn`` sizes each CoCLR stage by the time its budget has left); each stage's folder records its own
epochs, so a stage continues only as it started.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from coclr.atomic import atomic_write_json, read_json_lines, read_json_record
from coclr.config import validate
from coclr.core.methods import METHODS
from coclr.data.datasets import usable_entries
from coclr.distributed import held_by_main, init_distributed, is_main, launched_world_size
from coclr.errors import ConfigError
from coclr.interrupts import interrupted
from coclr.models.loading import require_checkpoint_file
from coclr.progress import duration
from coclr.runfolder import FolderRule, check_folder, check_restart, claim_folder, read_record
from coclr.store.clipstore import open_store
from coclr.train.checkpoint import write_view_encoders
from coclr.train.config import PER_STAGE, PipelineConfig, PretrainConfig
from coclr.train.model import check_architecture, check_view_of
from coclr.train.run import pretrain
from coclr.train.setup import (
    CONTINUABLE,
    LAST,
    PATH_OPTIONS,
    as_typed,
    check_inputs,
    check_steps_on_videos,
    resolve_device,
    resolve_precision,
    run_options,
)

MANIFEST = "manifest.json"
PIPELINE_FOLDER = FolderRule("pipeline", "a pipeline run", may_differ=(*CONTINUABLE, *PER_STAGE), restart=True,
                             paths=(*PATH_OPTIONS, "pipeline.init", "pipeline.second_init", "pipeline.miner",
                                    "pipeline.infonce_from"), rooted=True, since=("run.global_batch",),
                             shown=as_typed)
"""How a pipeline folder is continued or refused (:mod:`coclr.runfolder`); the options each stage sets never
changed a pipeline's work (a folder started with one, before they were refused, continues without it). The global
batch (``run.batch_size`` x processes) stays, as in each stage (a folder recorded before it was, continues)."""


@dataclass
class Stage:
    """One stage of the pipeline and the stages whose encoders it starts from or mines with."""

    name: str
    method: str
    trains: list[str]
    cycle: int
    epochs: int
    milestones: list[int]
    frozen: str | None = None
    lr: float | None = None
    """the stage's lr (None: the pipeline's ``optim.lr``)"""
    init_from: dict[str, str] = field(default_factory=dict)
    """view -> name of the stage whose last encoder of that view initialises this one"""
    sampler_from: str | None = None
    """name of the stage whose encoder of the frozen view mines positives"""
    sampler_file: str | None = None
    """a fixed checkpoint of the frozen view that mines positives instead (``pipeline.miner``)"""
    init_file: str | None = None
    """a checkpoint that initialises the (InfoNCE) stage's view (``pipeline.init``, ``pipeline.second_init``)"""
    share: float = 1.0
    """the share of its planned epochs a caller sized it to, when fewer (``coclr learn``'s stages sized to the time
    left): its warm-up and its own-key phase (``method.own_positive_epochs``) shrink with it, so that it keeps the
    recipe's shape (a stage cut to 2 of 8 epochs spent them all in warm-up, its own key never dropped)"""


def plan_stages(config: PipelineConfig) -> list[Stage]:
    """InfoNCE for both views (each from ``pipeline.init`` / ``second_init`` when set, else from scratch), then
    ``cycles`` of (view 1 with view 2 frozen, view 2 with view 1 frozen); with ``pipeline.miner``, cycles of view 2
    alone, mined by that checkpoint of view 1."""
    opts = config.pipeline
    view1, view2 = config.data.view, config.data.second_view
    stages = [Stage(f"infonce_{v}", "infonce", [v], 0, opts.infonce_epochs, opts.infonce_milestones,
                    init_file=init) for v, init in ((view1, opts.init), (view2, opts.second_init))]
    latest = {view1: stages[0].name, view2: stages[1].name}
    if opts.infonce_from:  # the InfoNCE encoders come from another pipeline folder
        stages = []
    for cycle in range(1, opts.cycles + 1):
        if opts.mode == "sim":
            stage = Stage(f"cycle{cycle}_sim", "coclr", [view1, view2], cycle, 2 * opts.cycle_epochs,
                          [2 * m for m in opts.cycle_milestones], lr=opts.cycle_lr, init_from=dict(latest))
            stages.append(stage)
            latest = {view1: stage.name, view2: stage.name}
            continue
        for trained, frozen in ((view1, view2), (view2, view1)):
            if opts.miner is not None and trained == view1:  # the fixed miner of view 1 is not trained
                continue
            stage = Stage(f"cycle{cycle}_{trained}", "coclr", [trained], cycle, opts.cycle_epochs,
                          opts.cycle_milestones, frozen=frozen, lr=opts.cycle_lr, init_from={trained: latest[trained]},
                          sampler_from=None if opts.miner else latest[frozen], sampler_file=opts.miner)
            stages.append(stage)
            latest[trained] = stage.name
    return stages


def encoder_file(run_dir: Path, stage: str, view: str, config: PipelineConfig | None = None) -> Path:
    """The encoder of ``view`` a finished stage exports (an InfoNCE stage of ``pipeline.infonce_from`` when set)."""
    if config is not None and config.pipeline.infonce_from and stage.startswith("infonce_"):
        run_dir = Path(config.pipeline.infonce_from)
    return run_dir / stage / f"encoder_{view}.pth"


def stage_config(config: PipelineConfig, stage: Stage, run_dir: Path) -> PretrainConfig:
    """The pretraining configuration of one stage, derived from the pipeline's shared options."""
    data = copy.deepcopy(config.data)
    trained = stage.trains[0]
    if trained != config.data.view:
        data.view, data.second_view = config.data.second_view, config.data.view
    method = copy.deepcopy(config.method)
    method.name = stage.method
    method.simultaneous = len(stage.trains) == 2
    if not (METHODS[stage.method].mines and not method.simultaneous):  # (mine_in=both: the alternating stages')
        method.mine_in = "other"
    method.init_checkpoint = (str(encoder_file(run_dir, stage.init_from[trained], trained, config))
                              if stage.init_from else stage.init_file or "")
    method.second_init_checkpoint = (str(encoder_file(run_dir, stage.init_from[data.second_view], data.second_view,
                                                      config)) if method.simultaneous else "")
    if stage.sampler_file:
        method.sampler_checkpoint = stage.sampler_file
    else:
        method.sampler_checkpoint = (str(encoder_file(run_dir, stage.sampler_from, stage.frozen, config))
                                     if stage.sampler_from else "")
    if stage.share < 1.0:
        method.own_positive_epochs *= stage.share
    optim = copy.deepcopy(config.optim)
    optim.epochs, optim.milestones = stage.epochs, list(stage.milestones)
    optim.warmup_epochs = min(optim.warmup_epochs * min(stage.share, 1.0), stage.epochs)  # (a stage coclr learn
    # sized shorter than the plan; the pipeline's options never hold a warm-up longer than a stage: its validate)
    if stage.lr is not None:
        optim.lr = stage.lr
    run = copy.deepcopy(config.run)
    run.out = str(run_dir / stage.name)
    stage_cfg = PretrainConfig(data=data, model=copy.deepcopy(config.model), method=method, optim=optim,
                               augment=copy.deepcopy(config.augment), run=run)
    validate(stage_cfg)
    return stage_cfg


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The pipeline's manifest (its stages, their checkpoints and times), empty before the first stage ends."""
    return read_json_record(run_dir / MANIFEST) or {}


def epoch_seconds(run_dir: Path, stage: str) -> list[float]:
    """The seconds of each epoch a stage has trained (its ``log.jsonl``; none before its first epoch)."""
    log = run_dir / stage / "log.jsonl"
    if not log.is_file():
        return []
    return [r["epoch_seconds"] for r in read_json_lines(log) if isinstance(r, dict) and "epoch_seconds" in r]


def pipeline_eta(run_dir: Path, stages: list[Stage], until: str | None = None) -> str:
    """How much of the pipeline (of its stages up to ``until``) is done, in epochs, and the time left at the mean
    time of a view's epoch of each method in its training logs so far (every stage's ``log.jsonl`` records each
    epoch's seconds; an epoch of a stage that trains both views at once, ``sim``, costs two; a CoCLR epoch, which
    mines, costs more than an InfoNCE one): a method not timed yet is taken at the mean of those that are, and
    said so."""
    if until is not None:
        stages = stages[:[stage.name for stage in stages].index(until) + 1]
    logged = {stage.name: epoch_seconds(run_dir, stage.name) for stage in stages}
    done: dict[str, int] = {}  # views' epochs timed, and their seconds, by method
    seconds: dict[str, float] = {}
    for stage in stages:
        done[stage.method] = done.get(stage.method, 0) + len(logged[stage.name]) * len(stage.trains)
        seconds[stage.method] = seconds.get(stage.method, 0.0) + sum(logged[stage.name])
    total = sum(stage.epochs for stage in stages)
    text = (f"{sum(map(len, logged.values()))}/{total} epochs "
            f"{'of the pipeline' if until is None else f'up to {until}'} done")
    timed = sum(done.values())
    if timed:
        mean = sum(seconds.values()) / timed
        left, untimed = 0.0, []
        for stage in stages:
            views_left = (stage.epochs - len(logged[stage.name])) * len(stage.trains)
            if views_left > 0 and not done[stage.method]:
                untimed.append(stage.method)
            left += views_left * (seconds[stage.method] / done[stage.method] if done[stage.method] else mean)
        text += f", about {duration(left)} left"
        if untimed:
            text += f" ({', '.join(dict.fromkeys(untimed))} epochs not timed yet: taken at the others')"
    return text


def export_encoders(checkpoint: Path, stage: Stage, run_dir: Path) -> dict[str, str]:
    """Write each trained view's encoder of a finished stage as its own file (what later stages load).

    Only rank 0 reads the checkpoint and writes; every rank gets the file names for the manifest.
    """

    files = {view: encoder_file(run_dir, stage.name, view) for view in stage.trains}
    if is_main():
        write_view_encoders(checkpoint, files, {"stage": stage.name, "method": stage.method})
    return {view: str(path.relative_to(run_dir)) for view, path in files.items()}


def _manifest_options(run_dir: Path) -> dict[str, Any] | None:
    """The options of a pipeline folder written before run records existed: those its manifest holds."""
    return read_manifest(run_dir).get("config")


def run_pipeline(config: PipelineConfig, until: str | None = None, restart: bool = False,
                 stages: list[Stage] | None = None) -> Path:
    """Run (or continue) every stage, or the stages up to and including ``until``; returns the run folder
    holding ``manifest.json``. A later call with the same options continues with the stages left pending; other
    options are refused before any work, naming each that differs (:mod:`coclr.runfolder`; the options listed
    in :data:`~coclr.train.setup.CONTINUABLE` may change). ``restart`` moves an earlier run aside first.
    ``stages``: :func:`plan_stages` of the config with other epochs and milestones (:func:`check_sized`)."""
    run_dir = Path(config.run.out)
    stages = check_sized(plan_stages(config), stages) if stages is not None else plan_stages(config)
    names = [stage.name for stage in stages]
    if until is not None and until not in names:
        raise ConfigError(f"--until {until}: no stage {until!r} in this pipeline; its stages are {', '.join(names)}")
    device = resolve_device(config.run.device)
    if restart:  # every process: the same refusal on each (not rank 0's alone, the others waiting for it); the
        check_restart(run_dir, PIPELINE_FOLDER, legacy=_manifest_options)  # folder is moved once all is checked
    processes = launched_world_size()  # (the stages' checks count every process's batch)
    # as each stage records them, the global batch with them (the stages not started took a new one in silence)
    options = run_options(resolve_precision(config, device), processes)
    if not restart:
        check_folder(run_dir, PIPELINE_FOLDER, options, _manifest_options)
    views = {"init": config.data.view, "second_init": config.data.second_view, "miner": config.data.view}
    for key, view in views.items():  # read now, not when their stage starts after others trained
        path = getattr(config.pipeline, key)
        if path is not None:
            require_checkpoint_file(path, f"pipeline.{key}")
            check_view_of(path, view, f"pipeline.{key}")
            if key != "miner":  # (a miner mines with its own network)
                check_architecture(path, config, f"pipeline.{key}")
    if config.pipeline.infonce_from:
        needed = [encoder_file(run_dir, f"infonce_{view}", view, config)
                  for view in (config.data.view, config.data.second_view)]
        absent = [str(path) for path in needed if not path.is_file()]
        if absent:
            raise ConfigError(f"pipeline.infonce_from: {config.pipeline.infonce_from} has no finished InfoNCE stage "
                              f"({', '.join(absent)} missing): run that pipeline's InfoNCE stages first")
        for path in needed:
            check_architecture(path, config, "pipeline.infonce_from")
    previous = {} if restart else read_manifest(run_dir)  # (a restart's folder is moved aside before the claim)
    status = {s["name"]: s for s in previous.get("stages", [])}
    recorded = None if restart else read_record(run_dir)
    manifest = {"config": recorded["options"] if recorded else previous.get("config", options), "stages": []}
    for stage in stages:
        entry = status.get(stage.name, {})
        manifest["stages"].append({
            "name": stage.name, "method": stage.method, "view": "+".join(stage.trains),
            "trains": "+".join(stage.trains), "frozen": stage.frozen, "cycle": stage.cycle,
            "epochs": stage.epochs, "checkpoint": str(Path(stage.name) / LAST),
            "encoders": entry.get("encoders", {}), "status": entry.get("status", "pending"),
        })
    stage_configs = [stage_config(config, stage, run_dir) for stage in stages]
    runs = names.index(until) + 1 if until is not None else len(stages)
    _check_every_stage_trains(config, stages[:runs], stage_configs[:runs])
    lost = _lost_encoders(run_dir, stages, manifest)
    pending = [number for number, entry in enumerate(manifest["stages"][:runs]) if entry["status"] != "done"]
    if pending and not lost:  # the next stage's inputs (its files, views, labels, device options): refused now, not
        check_inputs(stage_configs[pending[0]], device)  # after a claim (lost encoders are written first)
    init_distributed(device)  # under torchrun, once every check above passed on every process (a process refused by
    # them tells the others: coclr.distributed.share_refusal); rank 0 alone holds the folder and writes its manifest
    with held_by_main(lambda: claim_folder(run_dir, PIPELINE_FOLDER, options, restart=restart,  # (moved aside only
                                           legacy=_manifest_options)):  # now, once every check above passed)
        for stage in lost:  # their checkpoints are there: written again, as when the stage finished
            export_encoders(run_dir / stage.name / LAST, stage, run_dir)
        return _run_stages(run_dir, stages, stage_configs, manifest, until)


def _lost_encoders(run_dir: Path, stages: list[Stage], manifest: dict[str, Any]) -> list[Stage]:
    """The finished stages whose encoder files are gone but whose last checkpoint is there (to export again);
    refused in one line, before any work, where the checkpoint is gone too (a stage's folder deleted: a later stage
    failed, after the stages before it trained, naming an option the pipeline sets itself)."""
    lost = []
    for stage, entry in zip(stages, manifest["stages"]):
        if entry["status"] != "done":
            continue
        missing = [run_dir / path for path in entry["encoders"].values() if not (run_dir / path).is_file()]
        if not missing:
            continue
        if not (run_dir / stage.name / LAST).is_file():
            raise ConfigError(f"{run_dir}: stage {stage.name} is recorded finished, but {missing[0]} and its "
                              "checkpoint are gone: put them back, or --restart to train the pipeline again")
        lost.append(stage)
    return lost


def _check_every_stage_trains(config: PipelineConfig, stages: list[Stage],
                              stage_configs: list[PretrainConfig]) -> None:
    """Before the first stage: the split has videos with every view a stage to run reads
    (:func:`~coclr.data.datasets.usable_entries`), and no stage to run may spend all its iterations filling its queue
    (:func:`~coclr.train.setup.check_steps_on_videos`), counted on every video of the split (the trainer, which
    counts the videos it can read, checks again at its start). A store that is not one is refused here, before the
    folder is claimed."""
    if not Path(config.data.store).is_dir():
        raise ConfigError(f"data.store: not a directory: {config.data.store}")
    store = open_store(config.data.store)
    usable_entries(store, config.data.split, sorted({view for options in stage_configs for view in options.views}))
    # (a split without videos, a view not built: said now, not after a stage trained on the other view)
    videos = store.index.split_counts().get(config.data.split, 0)
    processes = launched_world_size()
    for stage, options in zip(stages, stage_configs):
        check_steps_on_videos(options, videos, processes, f"stage {stage.name}: ",
                              epochs_key=f"pipeline.{'infonce' if stage.cycle == 0 else 'cycle'}_epochs")


def check_sized(planned: list[Stage], sized: list[Stage]) -> list[Stage]:
    """``sized``, checked to be the ``planned`` stages but for their epochs, milestones and share (a caller's error
    otherwise)."""
    def unsized(stages: list[Stage]) -> list[Stage]:
        return [replace(stage, epochs=0, milestones=[], share=1.0) for stage in stages]

    if unsized(sized) != unsized(planned):
        raise ValueError("sized stages differ from the pipeline's own in more than their epochs and milestones")
    return sized


def _run_stages(run_dir: Path, stages: list[Stage], stage_configs: list[PretrainConfig], manifest: dict[str, Any],
                until: str | None) -> Path:
    """Run the stages up to ``until`` that are not done yet, recording each in the manifest."""
    names = [stage.name for stage in stages]
    count = names.index(until) + 1 if until is not None else len(stages)
    for number, (stage, stage_cfg, entry) in enumerate(zip(stages[:count], stage_configs, manifest["stages"]), 1):
        if entry["status"] == "done":
            continue
        entry["status"] = "running"
        if is_main():
            atomic_write_json(run_dir / MANIFEST, manifest)
            print(f"[coclr pipeline] stage {number}/{len(stages)}: {stage.name} ({stage.method} on "
                  f"{'+'.join(stage.trains)}, {stage.epochs} epochs); {pipeline_eta(run_dir, stages, until)}",
                  flush=True)
        label = f"stage {number}/{len(stages)} {stage.name}"
        try:
            trained = pretrain(stage_cfg, label=label)
        except KeyboardInterrupt as error:  # the trainer says which checkpoint is kept; before it, the stage's own
            stopped = interrupted(error, "what its earlier runs finished is kept")
            stopped.kept = f"{label}: {stopped.kept}"
            raise stopped from None
        if not trained.finished:
            return run_dir
        entry["encoders"] = export_encoders(trained.checkpoint, stage, run_dir)
        entry["status"] = "done"
        if dist.is_initialized():
            dist.barrier()
        if is_main():
            atomic_write_json(run_dir / MANIFEST, manifest)
    return run_dir
