"""A study as jobs: the stages each row needs, computed once and shared, in the order they can run.

Every training stage is a task (:mod:`coclr.jobs.tasks`): one pretraining stage or a pipeline, each the
configuration ``coclr pretrain`` or ``coclr pipeline`` would run from the YAML file written to ``OUT/configs``, and
finetuning one stream, so each is resumable and refuses a changed configuration on its own. The InfoNCE encoders of
both views (``OUT/pipeline``) start every later stage: CoCLR's cycles (``OUT/pipeline``), the ablations K=1, K=50,
'sim' and alternation with sim's updates (``OUT/coclr_k1``, ``OUT/coclr_k50``, ``OUT/coclr_sim``,
``OUT/coclr_equal``, whose pipelines take their InfoNCE stages from ``OUT/pipeline``), CoCLR-Flow with its positives
mined by a fixed RGB encoder (``OUT/coclr_ubernce_miner``: the oracle's, after its job; ``OUT/coclr_infonce_miner``:
InfoNCE-RGB's), both views' CoCLR mined in both views' similarity (``OUT/coclr_both``), the UberNCE oracle
(``OUT/ubernce_rgb``) and CMC (``OUT/cmc``). The Cross-Entropy row trains with labels from a random encoder
(``OUT/cross_entropy``). :func:`plan_study` builds and validates all of it, and checks every path and every task's
record, before any work.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coclr.clips import recorded_clips
from coclr.config import from_dict, load_config, merge, to_dict
from coclr.core.methods import METHODS
from coclr.errors import ConfigError
from coclr.eval.evaluate import check_split_labels
from coclr.eval.options import ClipConfig, FinetuneConfig, LinearProbeConfig, check_ten_crops
from coclr.flow.options import FlowOptions
from coclr.jobs.scheduler import Job
from coclr.jobs.tasks import Finetune, Flow, Pipeline, Pretrain, check_records
from coclr.store.clipstore import open_store
from coclr.study.config import ROWS, STUDY_SYNTH, StudyConfig, supervised_row
from coclr.synth import SynthConfig
from coclr.synth.config import dataset_clips
from coclr.train.config import PipelineConfig, PretrainConfig
from coclr.train.pipeline import LAST, Stage, plan_stages, stage_config
from coclr.train.setup import check_steps_on_videos
from coclr.video import indexes


def _equal_updates(pipeline: dict[str, Any]) -> dict[str, Any]:
    """Alternation with sim's updates per network: each half-cycle as long as sim's cycle (which trains both
    views for twice ``cycle_epochs``), its milestones scaled as sim's are."""
    return {"pipeline": {"cycle_epochs": 2 * pipeline["cycle_epochs"],
                         "cycle_milestones": [2 * m for m in pipeline["cycle_milestones"]]}}


ABLATIONS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "coclr_k1_rgb": ("coclr_k1", lambda pipeline: {"method": {"topk": 1}}),
    "coclr_k50_rgb": ("coclr_k50", lambda pipeline: {"method": {"topk": 50}}),
    "coclr_sim_rgb": ("coclr_sim", lambda pipeline: {"pipeline": {"mode": "sim"}}),
    "coclr_equal_rgb": ("coclr_equal", _equal_updates),
    # Only the miner changes, which the row names (Row.miner, set as pipeline.miner): no RGB stage is trained.
    "coclr_ubernce_miner_flow": ("coclr_ubernce_miner", lambda pipeline: {}),
    "coclr_infonce_miner_flow": ("coclr_infonce_miner", lambda pipeline: {}),
    # Both views' rows of one pipeline, every CoCLR stage mined in both views' summed similarity.
    "coclr_both_rgb": ("coclr_both", lambda pipeline: {"method": {"mine_in": "both"}}),
    "coclr_both_flow": ("coclr_both", lambda pipeline: {"method": {"mine_in": "both"}}),
}
"""The CoCLR ablations: the folder of each one's pipeline and what it changes, given the main pipeline's
``pipeline`` options; a row with a ``miner`` (:class:`coclr.study.config.Row`) also sets ``pipeline.miner`` to
that row's encoder, and waits for its job. Each evaluates its row's view after the last cycle. Rows that share a
folder share its pipeline: the later row's job continues it after the earlier one's."""


@dataclass
class StudyPlan:
    """Everything a study runs, built and checked before any work."""

    config: StudyConfig
    out: Path
    store: Path
    configs: dict[str, dict[str, Any]]
    """YAML files to write under ``OUT/configs`` (name -> options)."""
    jobs: list[Job]
    """The jobs, in the order they start when they can (the critical path first)."""
    encoders: dict[str, Path]
    """Encoder name (see :data:`coclr.study.config.ROWS`) -> the checkpoint its training writes."""
    clips: Any
    """The evaluation's :class:`~coclr.eval.features.ClipConfig`."""
    probe: Any
    """The :class:`~coclr.eval.linear.LinearProbeConfig`."""
    finetune: Any
    """The :class:`~coclr.eval.finetune.FinetuneConfig` of every row's finetune column."""
    supervised: Any
    """The :class:`~coclr.eval.finetune.FinetuneConfig` of the Cross-Entropy row's training."""
    last: str = ""
    """Name of the last CoCLR cycle (``cycle<cycles>``)."""
    synth: Any = None
    """The :class:`~coclr.synth.SynthConfig` of a synthetic study."""
    index: Any = None
    """The :class:`~coclr.video.indexes.VideoIndex` of a study that builds its store from videos."""
    views: list[str] = field(default_factory=lambda: ["rgb", "flow"])
    mining: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    """Encoder name -> the training logs of the CoCLR stages that trained it with mined positives (each logs
    ``<view>/mined_precision``, the share of the positives with the query's class)."""

    @property
    def evaluated_views(self) -> list[str]:
        """Every row is evaluated on the videos that have all of these views (the same videos for every row)."""
        return self.views


def study_store(config: StudyConfig, out: Path) -> Path:
    """The study's clip store: the given one, or ``OUT/store``."""
    return Path(config.data.store) if config.data.store else out / "store"


def _milestones(config: StudyConfig, explicit: list[int], epochs: int) -> list[int]:
    """A stage's lr milestones: the explicit ones, or the start of its last ``decay_epochs``."""
    if explicit:
        return list(explicit)
    return [epochs - config.schedule.decay_epochs] if config.schedule.decay_epochs else []


def base_options(config: StudyConfig, store: Path) -> dict[str, Any]:
    """The ``coclr pretrain`` options every stage shares: the study's ``train`` section with the store, the views
    (RGB, then flow) and the seed, and a milestone schedule when the schedule decays the lr."""
    schedule = config.schedule
    # an empty section (`optim:` alone, or null) is its defaults, as coclr pretrain reads one (a traceback here)
    sections = {name: section for name, section in copy.deepcopy(config.train).items() if section is not None}
    base = merge(sections, {"data": {"store": str(store), "view": "rgb", "second_view": "flow"},
                                               "run": {"seed": config.seed}})
    decays = schedule.decay_epochs or schedule.infonce_milestones or schedule.cycle_milestones
    for section in (part.name for part in dataclasses.fields(PretrainConfig)):  # the stages extend each one
        base.setdefault(section, {})
    base["optim"]["schedule"] = "milestones" if decays else base["optim"].get("schedule", "constant")
    return base


def _pretrain_config(options: dict[str, Any], where: str) -> PretrainConfig:
    """A validated :class:`PretrainConfig`, as ``coclr pretrain`` reads it from its YAML file; errors name the
    study option the stage came from."""

    try:
        return load_config(PretrainConfig, base=options)
    except ConfigError as error:
        raise ConfigError(f"train (the {where}): {error}") from None


def _pipeline_config(options: dict[str, Any], where: str) -> PipelineConfig:
    """A validated :class:`PipelineConfig`, as ``coclr pipeline`` reads it from its YAML file; errors name the
    study option the pipeline came from."""

    try:
        return load_config(PipelineConfig, base=options)
    except ConfigError as error:
        said = str(error)
        for key in ("infonce_epochs", "cycle_epochs"):  # (the study's schedule sets them)
            said = said.replace(f"pipeline.{key}", f"schedule.{key}")
        raise ConfigError(f"train (the {where}): {said}") from None


def _stage_config(pipeline: PipelineConfig, stage, folder: Path, where: str) -> PretrainConfig:
    """A pipeline stage's validated configuration (:func:`~coclr.train.pipeline.stage_config`); errors name the
    study option and the row or stage they came from (a row's own setting, e.g. its top-K, beside the study's)."""
    try:
        return stage_config(pipeline, stage, folder)
    except ConfigError as error:
        raise ConfigError(f"train (the {where}'s {stage.name} stage): {error}") from None


def plan_study(config: StudyConfig, out: str | Path) -> StudyPlan:
    """Every job, configuration and output of the study in ``out``, checked: the data's paths, every stage's
    options, the evaluation's options, every task's record. Raises a :class:`~coclr.errors.CoclrError`
    naming the option or file before any work."""

    out = Path(out)
    store = study_store(config, out)
    schedule = config.schedule
    rows = [ROWS[key] for key in config.rows]
    needed = {name for row in rows for name, _ in row.streams}
    needed |= {ROWS[name].miner for name in needed if name in ROWS and ROWS[name].miner}
    base = base_options(config, store)
    configs: dict[str, dict[str, Any]] = {}
    jobs: list[Job] = []
    encoders: dict[str, Path] = {}
    producers: dict[str, str] = {}  # encoder name -> the job that writes it
    mining: dict[str, tuple[Path, ...]] = {}
    last = f"cycle{schedule.cycles}"

    pipeline_options = {**base, "pipeline": {
        "cycles": schedule.cycles, "infonce_epochs": schedule.infonce_epochs, "cycle_epochs": schedule.cycle_epochs,
        "mode": "alternate", "cycle_lr": schedule.cycle_lr,
        "infonce_milestones": _milestones(config, schedule.infonce_milestones, schedule.infonce_epochs),
        "cycle_milestones": _milestones(config, schedule.cycle_milestones, schedule.cycle_epochs)},
        "run": {**base["run"], "out": str(out / "pipeline")}}
    pipeline = _pipeline_config(pipeline_options, "CoCLR pipeline")
    stages = plan_stages(pipeline)
    for stage in stages[:2]:
        configs[stage.name] = to_dict(_stage_config(pipeline, stage, out / "pipeline", "CoCLR pipeline"))
        jobs.append(Job(stage.name, Pretrain(_pretrain_config(configs[stage.name], f"{stage.name} stage")), (),
                        stage.epochs, (out / "pipeline" / stage.name,)))
    # The pipeline marks the InfoNCE stages done and exports their encoders, which every later stage starts from.
    configs["pipeline"] = pipeline_options
    jobs.append(Job("infonce", Pipeline(pipeline, until=stages[1].name), ("infonce_rgb", "infonce_flow")))
    encoders.update({f"infonce_{v}": out / "pipeline" / f"infonce_{v}" / f"encoder_{v}.pth" for v in ("rgb", "flow")})
    producers.update({f"infonce_{v}": "infonce" for v in ("rgb", "flow")})
    if needed & {"coclr_rgb", "coclr_flow"}:
        names = [stage.name for stage in stages]
        cycles = stages[2:] if "coclr_flow" in needed else stages[2: names.index(f"{last}_rgb") + 1]
        until = None if "coclr_flow" in needed else f"{last}_rgb"
        jobs.append(Job("coclr", Pipeline(pipeline, until=until), ("infonce",), sum(s.epochs for s in cycles),
                        tuple(out / "pipeline" / s.name for s in cycles)))
        encoders.update({f"coclr_{v}": out / "pipeline" / f"{last}_{v}" / f"encoder_{v}.pth" for v in ("rgb", "flow")})
        producers.update({f"coclr_{v}": "coclr" for v in ("rgb", "flow")})
        mining.update({f"coclr_{v}": _mining_logs(stages[: names.index(f"{last}_{v}") + 1], v, out / "pipeline")
                       for v in ("rgb", "flow")})
    ablations_at = len(jobs)  # the ablations' long pipelines start before the oracle and CMC, though they are
    # planned after them (the job of a miner must be known)
    lr_after_infonce = {"lr": schedule.cycle_lr} if schedule.cycle_lr is not None else {}
    if "ubernce_rgb" in needed:
        epochs = schedule.oracle_epochs()
        method = {**base["method"], "name": "ubernce", "loss_form": schedule.ubernce_loss}
        optim = {**base["optim"], "epochs": epochs,
                 "milestones": _milestones(config, schedule.cycle_milestones if schedule.ubernce_start == "infonce"
                                           else schedule.infonce_milestones, epochs)}
        deps: tuple[str, ...] = ()
        if schedule.ubernce_start == "infonce":  # trained like CoCLR-RGB: from InfoNCE-RGB, at CoCLR's lr
            method["init_checkpoint"] = str(out / "pipeline" / "infonce_rgb" / LAST)
            optim.update(lr_after_infonce)
            deps = ("infonce_rgb",)
        configs["ubernce_rgb"] = {**base, "method": method, "optim": optim,
                                  "run": {**base["run"], "out": str(out / "ubernce_rgb")}}
        jobs.append(Job("ubernce_rgb", Pretrain(_pretrain_config(configs["ubernce_rgb"], "UberNCE oracle")), deps,
                        epochs, (out / "ubernce_rgb",)))
        encoders["ubernce_rgb"] = out / "ubernce_rgb" / LAST
    if "cmc_rgb" in needed:
        epochs = schedule.cmc_epochs or schedule.cycles * schedule.cycle_epochs
        configs["cmc"] = {**base, "method": {**base["method"], "name": "cmc",
                                             "init_checkpoint": str(encoders["infonce_rgb"]),
                                             "second_init_checkpoint": str(encoders["infonce_flow"])},
                          "optim": {**base["optim"], "epochs": epochs, **lr_after_infonce,
                                    "milestones": _milestones(config, schedule.cycle_milestones, epochs)},
                          "run": {**base["run"], "out": str(out / "cmc")}}
        jobs.append(Job("cmc_rgb", Pretrain(_pretrain_config(configs["cmc"], "CMC stage")), ("infonce",), epochs,
                        (out / "cmc",)))
        encoders["cmc_rgb"] = out / "cmc" / LAST

    planned: dict[str, tuple[int, str]] = {}  # folder -> (stages its jobs run, the job of its last row)
    for key, (folder, changes) in ABLATIONS.items():
        if key not in needed:
            continue
        row = ROWS[key]
        view = row.streams[0][1]
        change = changes(pipeline_options["pipeline"])
        pipeline_change = {**change.get("pipeline", {}), "infonce_from": str(out / "pipeline")}
        deps = ("infonce",)
        if row.miner:  # its positives are mined by another row's encoder: that row's job comes first
            pipeline_change["miner"] = str(encoders[row.miner])
            deps = tuple(dict.fromkeys((*deps, producers.get(row.miner, row.miner))))
        options = merge(pipeline_options, {**change, "pipeline": pipeline_change, "run": {"out": str(out / folder)}})
        ablation = _pipeline_config(options, f"{key} pipeline")
        ablation_stages = plan_stages(ablation)
        final = next(s.name for s in ablation_stages if s.name.startswith(last) and view in s.trains)
        for stage in ablation_stages:
            _stage_config(ablation, stage, out / folder, f"{key} row")  # checks every stage's options now
        configs[folder] = options
        count = [s.name for s in ablation_stages].index(final) + 1
        start, earlier = planned.get(folder, (0, None))
        if earlier is not None:  # another row's job runs this pipeline's first stages: continue after it
            deps = tuple(dict.fromkeys((*deps, earlier)))
        if count > start:
            jobs.insert(ablations_at, Job(key, Pipeline(ablation, until=final), deps,
                                          sum(s.epochs for s in ablation_stages[start:count]),
                                          tuple(out / folder / s.name for s in ablation_stages[start:count])))
            ablations_at += 1
            planned[folder] = (count, key)
        producers[key] = planned[folder][1]
        encoders[key] = out / folder / final / f"encoder_{view}.pth"
        mining[key] = _mining_logs(ablation_stages[:count], view, out / folder)

    training = _pretrain_config(configs[stages[0].name], "InfoNCE stage")
    evaluation = config.eval
    clips = from_dict(ClipConfig, {**training.data.clips.to_dict(), **recorded_clips(dataclasses.asdict(evaluation)),
                                   "batch_size": evaluation.batch_size}, prefix="eval.")
    probe = from_dict(LinearProbeConfig, {**evaluation.linear, "seed": config.seed}, prefix="eval.linear.")
    finetune = from_dict(FinetuneConfig, {**evaluation.finetune, "seed": config.seed}, prefix="eval.finetune.")
    supervised_epochs = schedule.infonce_epochs + schedule.cycles * schedule.cycle_epochs
    supervised = from_dict(FinetuneConfig, {"epochs": supervised_epochs,
                                            "milestones": _milestones(config, [], supervised_epochs),
                                            "dropout": 0.5, "backbone_lr_scale": 1.0, "lr": training.optim.lr,
                                            **schedule.supervised, "seed": config.seed}, prefix="schedule.supervised.")
    check_ten_crops(finetune, clips.size, "eval.finetune.ten_crop_short_side")
    check_ten_crops(supervised, clips.size, "schedule.supervised.ten_crop_short_side")
    plan = StudyPlan(config, out, store, configs, jobs, encoders, clips, probe, finetune, supervised, last,
                     mining=mining)
    flow = from_dict(FlowOptions, {"backend": config.data.flow_backend, "view": "flow", "split": "test",
                                   "bound": float(config.data.flow_bound), "workers": 1}, prefix="data.flow_")
    jobs.append(Job("flow_test", Flow(store, flow)))
    for row in rows:  # its encoder is known once its random initialisation is written (run)
        if supervised_row(row.key):
            jobs.append(Job(row.key, finetune_task(plan, cross_entropy_init(plan), "rgb", supervised,
                                                   out / "cross_entropy"), ("flow_test",), supervised.epochs))
    if "finetune" in config.columns:
        for name, view in dict.fromkeys(stream for row in rows if not supervised_row(row.key)
                                        for stream in row.streams):  # a supervised row's training is its finetuning
            task = finetune_task(plan, encoders[name], view, finetune, out / "finetune")
            jobs.append(Job(f"finetune_{name}", task, (producers.get(name, name), "flow_test"), finetune.epochs))
    _check_data(plan)
    _check_every_stage_trains(plan)
    check_records([(job.name, job.task) for job in jobs])
    return plan


def _mining_logs(stages: list[Stage], view: str, run_dir: Path) -> tuple[Path, ...]:
    """The training logs of the CoCLR ``stages`` that trained ``view`` with mined positives."""
    return tuple(run_dir / stage.name / "log.jsonl" for stage in stages if METHODS[stage.method].mines
                 and view in stage.trains)


def cross_entropy_init(plan: StudyPlan) -> Path:
    """The random encoder the Cross-Entropy row trains from (written by the study, a function of the seed)."""
    return plan.out / "cross_entropy" / "random_init.pth"


def finetune_task(plan: StudyPlan, checkpoint: Path, view: str, options: FinetuneConfig, work_dir: Path) -> Finetune:
    """The finetuning of one stream, on the videos every row is evaluated on, with the evaluation's clips (as the
    evaluation of the row finds it done)."""
    others = tuple(v for v in plan.evaluated_views if v != view)
    return Finetune(checkpoint, view, plan.store, work_dir, plan.clips, options, others)


def _check_data(plan: StudyPlan) -> None:
    """The data the study starts from: the synthetic dataset's options, or the videos and split files (every video
    must exist), or an existing store with both splits."""

    data = plan.config.data
    if data.source == "synth":
        plan.synth = from_dict(SynthConfig, {**STUDY_SYNTH, **data.synth, "seed": plan.config.seed},
                               prefix="data.synth.")
        return
    if data.source == "store":

        store = open_store(plan.store)
        store.index.require_labels("a study (Table 1 is evaluated with labels)", ["train", "test"])
        for split in ("train", "test"):
            if not any(entry.split == split for entry in store.index.entries):
                raise ConfigError(f"data.store: {plan.store} has no {split!r} split; a study needs train and test")
        _check_evaluable(plan, store.index)
        return
    for key in ("root", "annotations"):
        path = getattr(data, key)
        if path and not Path(path).exists():
            raise ConfigError(f"data.{key}: not found: {path}")
    if data.source == "ucf101":
        index = indexes.ucf101_index(data.annotations, data.split)
    elif data.source == "hmdb51":
        index = indexes.hmdb51_index(data.annotations, data.split)
    elif data.source == "csv":
        index = indexes.csv_index(data.annotations)
    else:
        index = indexes.folder_index(data.root)
    indexes.check_videos_exist(index, data.root, "restore them" + (", or remove them from data.root" if data.source
                                                                    == "folder" else ", or remove their lines from "
                                                                    "data.annotations"))
    index.require_labels("a study (Table 1 is evaluated with labels)", ["train", "test"])
    for split in ("train", "test"):
        if split not in index.split_counts():
            raise ConfigError(f"data: the {data.source} index of {data.root} has no {split!r} split")
    _check_evaluable(plan, index)
    plan.index = index


def _check_evaluable(plan: StudyPlan, index) -> None:
    """What the evaluation refuses of the index's labels (:func:`coclr.eval.evaluate.check_evaluable`: one class
    in all, a probe selection holding out nothing), refused before the study trains anything (it was refused after
    every stage had trained)."""
    check_split_labels([entry for entry in index.entries if entry.split == "train"],
                       [entry for entry in index.entries if entry.split == "test"], "study",
                       plan.probe if "linear" in plan.config.columns else None)


def _train_videos(plan: StudyPlan) -> int:
    """The study's training videos: the synthetic dataset's, the store's or the index's train split (at most: the
    videos that fail to decode are left out later)."""
    if plan.synth is not None:
        return sum(clip.split == "train" for clip in dataset_clips(plan.synth))
    return (open_store(plan.store).index if plan.index is None else plan.index).split_counts().get("train", 0)


def _check_every_stage_trains(plan: StudyPlan) -> None:
    """Before the data is built: no training stage of a job may spend all its iterations filling its queue
    (:func:`~coclr.train.setup.check_steps_on_videos`; each job trains in one process)."""
    videos = _train_videos(plan)
    for job in plan.jobs:
        if isinstance(job.task, Pretrain):
            stages = [job.task.config]
        elif isinstance(job.task, Pipeline):
            config, planned = job.task.config, plan_stages(job.task.config)
            names = [stage.name for stage in planned]
            runs = planned[: names.index(job.task.until) + 1] if job.task.until in names else planned
            stages = [_stage_config(config, stage, Path(config.run.out), f"{job.name} job") for stage in runs]
        else:
            continue
        for options in stages:  # (named by its folder: a pipeline's stages may be run by several of its jobs)
            where = f"the stage in {Path(options.run.out).relative_to(plan.out)}: "
            epochs = "schedule.infonce_epochs" if options.method.name == "infonce" else "schedule.cycle_epochs"
            check_steps_on_videos(options, videos, 1, where, "train.", epochs)


def describe(plan: StudyPlan) -> str:
    """The plan in a few lines: data, rows, and every job with what it waits for."""
    config = plan.config
    lines = [f"study in {plan.out}: {len(config.rows)} rows ({', '.join(config.rows)}), columns "
             f"{', '.join(config.columns)}; data {config.data.source} -> {plan.store}; seed {config.seed}",
             f"evaluation: clips {plan.clips.length}x{plan.clips.size} (stride {plan.clips.stride}), on the videos "
             f"with {' and '.join(plan.evaluated_views)}"]
    for job in plan.jobs:
        lines.append(f"  {job.name}: {job.task.describe()}{f', {job.epochs} epochs' if job.epochs else ''}"
                     f" (after {', '.join(job.deps) or 'nothing'})")
    return "\n".join(lines)


def options_record(config: StudyConfig) -> dict[str, Any]:
    """The options a study folder records (``processes`` and ``gpus`` only schedule the work: left out)."""
    record = dataclasses.asdict(config)
    for key in ("processes", "gpus"):
        record.pop(key)
    return record
