"""Running a study end to end: data, flow, every stage, every evaluation, then the report.

The study folder follows :mod:`coclr.runfolder`: the same command continues it (every stage and evaluation is
resumable, and an evaluation whose inputs are unchanged is its record in ``OUT/eval``), other options are refused
before any work, naming each, and a second study on a running one is refused by its lock. ``processes`` and
``gpus`` only schedule the work and may change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from coclr.atomic import atomic_write_json, atomic_write_text, read_json_record
from coclr.config import parse_yaml
from coclr.errors import ConfigError, DataError
from coclr.eval.evaluate import TaskOptions, evaluate_checkpoint
from coclr.eval.features import Stream
from coclr.eval.finetune import ENCODER_FILE, stream_folder
from coclr.eval.report import (
    DEGENERATE_MARK,
    OTHER_CLIPS_MARK,
    degenerate,
    mined_precision,
    other_clips,
    report_run,
    view_name,
    write_report,
)
from coclr.jobs.scheduler import run_jobs, visible_gpus
from coclr.jobs.tasks import Flow
from coclr.models.encoder import build_encoder
from coclr.models.loading import checkpoint_sha256, save_encoder
from coclr.progress import bar as progress_bar
from coclr.runfolder import RUN_RECORD, FolderRefused, FolderRule, check_folder, check_output_folder, claim_folder
from coclr.seeding import check_seed
from coclr.store.build import build_store
from coclr.store.clipstore import DamagedEntryError, open_store
from coclr.store.flow_extract import extract_flow
from coclr.study.config import ROWS, STUDY_SYNTH, StudyConfig, supervised_row
from coclr.study.plan import StudyPlan, cross_entropy_init, describe, options_record, plan_study
from coclr.study.results import (
    MINING_PLOT,
    claims,
    collapse_warning,
    every_row_collapsed,
    plot_mining,
    results_markdown,
    seeds_markdown,
    summarise_seeds,
)
from coclr.synth import generate_synthetic
from coclr.synth.config import SynthConfig
from coclr.train.config import PretrainConfig
from coclr.train.setup import CONTINUABLE


def study_settings(record: dict[str, Any]) -> dict[str, Any]:
    """A study's recorded options as they are compared (:data:`STUDY_FOLDER`): numbers an earlier reading kept as
    text made numbers (:func:`numbers_of_text`), the ``train`` sections filled with ``coclr pretrain``'s
    defaults (a stage reads the default where the section says nothing: an option given at its default is the
    same setting), the generator's options with the study's, and the test clips' null with the training clips'."""
    record = numbers_of_text(record)
    data = record.get("data")
    if isinstance(data, dict) and isinstance(data.get("synth"), dict):  # the generator's options the study uses: a
        # value given at the one the study took is the same setting (it was refused as "frames=null (given 12)")
        defaults = {key: value for key, value in dataclasses.asdict(SynthConfig()).items() if key != "seed"}
        record["data"] = {**data, "synth": {**defaults, **STUDY_SYNTH, **data["synth"]}}
    if isinstance(record.get("train"), dict):
        defaults = {name: value for name, value in dataclasses.asdict(PretrainConfig()).items()
                    if isinstance(value, dict)}
        record["train"] = {**record["train"], **{
            section: {**values, **record["train"][section]} if isinstance(record["train"].get(section), dict)
            else record["train"].get(section, values) for section, values in defaults.items()}}
        trained, tested = record["train"].get("data"), record.get("eval")
        if isinstance(trained, dict) and isinstance(tested, dict):  # a test clip's null: the training clips' value
            record["eval"] = {**tested, **{key: trained.get(key) for key in ("length", "stride", "size")
                                          if tested.get(key) is None}}
    return record


def numbers_of_text(value: Any) -> Any:
    """``value`` (nested) with text that YAML 1.2 reads as a number made that number: a study recorded its mappings'
    values as YAML 1.1 read them (``1e-4`` as text), so that a folder it wrote compares equal to the same options
    read today."""
    if isinstance(value, dict):
        return {key: numbers_of_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [numbers_of_text(item) for item in value]
    if isinstance(value, str):
        try:
            read = parse_yaml(value)
        except yaml.YAMLError:
            return value
        return read if isinstance(read, (int, float)) and not isinstance(read, bool) else value
    return value


STUDY_FOLDER = FolderRule("study", "a study run", may_differ=(
    *(f"train.{key}" for key in CONTINUABLE if key not in ("run.out", "run.batch_size", "run.max_steps")),
    "data.flow_workers"), same=study_settings, rooted=True, since=("threads",))
"""How a study folder is continued or refused (:mod:`coclr.runfolder`); its options leave out ``processes`` and
``gpus``, which only schedule the work (each training job runs on ``threads``, compared where recorded: a folder from
before it was continues on 1), and its stages' options that never change a result may differ, as in
``coclr pretrain`` (:data:`coclr.train.setup.CONTINUABLE`; not the batch, a study's is its global batch; not
``run.max_steps``, which a study refuses), and so may the flow job's workers (not the evaluation's batch: the
finetuning trains in it)."""
SEEDS_FILES = ("seeds.json", "seeds.md", MINING_PLOT)
"""What ``--seeds`` writes beside the seeds' folders (the plot only when CoCLR rows of flow record their mined
positives' precision)."""


def prepare_data(plan: StudyPlan) -> None:
    """The store with its RGB view, and the train split's flow (training needs it first; the test split's flow
    is a job beside training). An input that fails is recorded in the store (:func:`failed_inputs`): left out, the
    study goes on with the others."""

    config = plan.config
    data = config.data
    workers = data.flow_workers or config.processes
    if data.source == "synth":

        print(f"[study] synthetic dataset -> {plan.store}", flush=True)
        print(generate_synthetic(plan.store, plan.synth, workers=workers), flush=True)
    elif data.source != "store":

        print(f"[study] decoding the videos of {data.root} -> {plan.store}", flush=True)
        print(build_store(plan.index, data.root, plan.store, short_side=data.short_side, quality=data.quality,
                          fps=data.fps, workers=workers), flush=True)
    print(f"[study] optical flow of the train split ({data.flow_backend})", flush=True)
    print(extract_flow(plan.store, backend=data.flow_backend, view="flow", workers=workers, split="train",
                       bound=data.flow_bound), flush=True)


def failed_inputs(plan: StudyPlan, partly: Sequence[str]) -> list[str]:
    """The inputs the study left out, one line each (``path: why``), each once with its first cause: those the
    store records as failed (decoding, either split's flow), and a line for each other job (``partly``: those that
    went through their inputs with some failed) that lists its own in its log."""
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    lines = [f"{key}: {why}" for key, why in ClipStore(plan.store).failed_inputs("rgb", "flow").items()]
    flow_jobs = {job.name for job in plan.jobs if isinstance(job.task, Flow)}  # (theirs are the store's)
    return lines + [f"some inputs of the job {name} failed, each listed in {plan.out / 'logs' / f'{name}.log'}"
                    for name in partly if name not in flow_jobs]


def write_cross_entropy_init(plan: StudyPlan) -> Path:
    """The random encoder the Cross-Entropy row trains from: a function of the seed and the model options."""
    import torch  # noqa: PLC0415 (heavy)


    path = cross_entropy_init(plan)
    if not path.is_file():
        model = plan.config.train.get("model", {})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(plan.config.seed)
            encoder = build_encoder(width=model.get("width", 1.0), gating=model.get("gating", False))
        save_encoder(path, encoder, meta={"method": "random", "view": "rgb"})
    return path


def eval_record(out: Path, row: str, task: str) -> Path:
    """Where a study keeps ``row``'s record of ``task``."""
    return out / "eval" / f"{row}_{task}.json"


def evaluate_rows(plan: StudyPlan) -> list[dict[str, Any]]:
    """Every row's evaluations (records written to ``OUT/eval``) and its numbers with the paper's. A record
    already there from the same inputs is taken as it is (:func:`coclr.eval.evaluate.inputs_digest`), so a finished
    study run again reports at once."""

    out, config = plan.out, plan.config
    store = open_store(plan.store)
    views = plan.evaluated_views
    cache = out / "feature_cache"
    common = {"with_views": views, "progress": False}
    options = TaskOptions(ks=config.eval.ks, probe=plan.probe, finetune=plan.finetune, work_dir=out / "finetune",
                          cache_dir=cache)
    for key in filter(supervised_row, config.rows):
        init = cross_entropy_init(plan)
        plan.encoders[key] = stream_folder(out / "cross_entropy", "rgb", checkpoint_sha256(init), views) / ENCODER_FILE

    rows = []
    bar = progress_bar(total=len(config.rows) * len(config.columns), desc="evaluation", unit="eval")
    for key in config.rows:
        bar.set_postfix_str(key)
        row = ROWS[key]
        streams = [Stream(plan.encoders[name], view) for name, view in row.streams]
        entry: dict[str, Any] = {"row": key, "method": row.method, "view": row.input, "labels": row.labels,
                                 "paper": dict(zip(("linear", "finetune", "retrieval"), row.paper))}

        def evaluate(task: str, streams: list[Stream] = streams, options: TaskOptions = options, key: str = key
                     ) -> dict[str, Any]:
            """The row's record of ``task``: its record in ``OUT/eval`` when that was computed from the same
            inputs, else a new evaluation, written there."""
            path = eval_record(out, key, task)
            earlier = read_json_record(path, "delete it to evaluate again")
            try:
                record = evaluate_checkpoint(task, store, streams, plan.clips, options, name=ROWS[key].method,
                                             earlier=earlier, **common)
            except DamagedEntryError as error:  # found as its frames were read: the study stops, as its rows must
                # compare the same videos (coclr eval leaves the video out and goes on: one encoder's figures)
                raise DataError(f"{error}; now listed as failed: run the same command again, whose store or flow "
                                "job rebuilds the entry") from None
            if record is not earlier:
                atomic_write_json(path, record)
            bar.update()
            return record

        records = []
        if "retrieval" in config.columns:
            record = evaluate("retrieval")
            entry["retrieval"] = {f"R@{k}": record["results"][f"R@{k}"] for k in record["config"]["ks"]}
            records.append(record)
        if "linear" in config.columns:
            record = evaluate("linear")
            entry["linear_top1"] = record["results"]["top1"]
            records.append(record)
        if "finetune" in config.columns:
            if supervised_row(key):  # its finetuning is its training, from the random encoder
                supervised = dataclasses.replace(options, finetune=plan.supervised, work_dir=out / "cross_entropy")
                record = evaluate("finetune", [Stream(cross_entropy_init(plan), "rgb")], supervised)
            else:
                record = evaluate("finetune")
            entry["finetune_top1"] = record["results"]["top1"]
            records.append(record)
        warnings = []
        for record in records:
            warnings += [collapse_warning(record)] if degenerate(record) else []
            warnings += [f"{OTHER_CLIPS_MARK} evaluated on {note}" for note in other_clips(record)]
        entry["collapsed"] = any(degenerate(record) for record in records)
        if len(row.streams) == 1 and row.streams[0][0] in plan.mining:
            entry["mined_precision"] = row_mined_precision(plan.mining[row.streams[0][0]], row.streams[0][1])
        if warnings:
            entry["warnings"] = list(dict.fromkeys(warnings))
            entry["marks"] = " " + "".join(mark for mark in (OTHER_CLIPS_MARK, DEGENERATE_MARK)
                                           if any(w.startswith(mark) for w in warnings))
        entry["records"] = records
        rows.append(entry)
    bar.close()
    return rows


def row_mined_precision(logs: Sequence[Path], view: str) -> float | None:
    """The share (%) of a CoCLR row's mined positives that had the query's class: the mean over its stages (the
    training ``logs``) of each stage's mean, as the stage table gives it (None when no stage logged one)."""
    values = [value for value in (mined_precision(log, view) for log in logs) if value is not None]
    return sum(values) / len(values) if values else None


def stage_records(plan: StudyPlan) -> list[dict[str, Any]]:
    """R@1 after every stage of the CoCLR pipeline (Figure 4), with the share of each CoCLR stage's mined positives
    that had the query's class; draws ``stage_recall.png``."""

    if not (plan.out / "pipeline" / "manifest.json").is_file():
        return []
    records = report_run(plan.out / "pipeline", open_store(plan.store), plan.out, plan.clips,
                         cache_dir=plan.out / "feature_cache", progress=False)
    return [{"stage": r["stage"], "view": view_name(r["streams"][0]["view"]), "R@1": r["results"]["R@1"],
             "mined_precision": r.get("mined_precision")} for r in records]


def run_study(config: StudyConfig, out: str | Path, check_only: bool = False) -> dict[str, Any] | None:
    """Run (or continue) the study in ``out``; returns the ``results.json`` content (None with ``check_only``,
    which validates everything and prints the plan)."""

    started = time.time()
    out = Path(os.path.abspath(out))
    plan = check_study(config, out)
    if check_only:
        print(describe(plan))
        return None
    with claim_folder(out, STUDY_FOLDER, options_record(config)):
        return _run_plan(plan, started)


def check_study(config: StudyConfig, out: Path) -> StudyPlan:
    """The plan of the study in ``out`` and the checks of its folder (reads only: a refusal names what differs)."""
    plan = plan_study(config, out)
    check_folder(out, STUDY_FOLDER, options_record(config))
    check_gpus(config)
    check_store_flow(config, plan.store)
    return plan


def check_store_flow(config: StudyConfig, store: Path) -> None:
    """Refuse, before the study's folder is made, a given store (``data.source=store``) whose flow view was
    extracted otherwise than the study would extract the rest of it (another backend, bound, mode or TV-L1
    parameters; not the kernels of tvl1-torch, which the flow job chooses and checks): the flow job would refuse it
    only after the folder was claimed with those options, and the folder then refuses the options that match the
    store."""
    from coclr.config import to_dict  # noqa: PLC0415
    from coclr.flow.backends import ALIASES  # noqa: PLC0415
    from coclr.flow.params import TVL1Params  # noqa: PLC0415
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415
    from coclr.store.flow_views import recorded_method, stored_bound  # noqa: PLC0415

    data = config.data
    if data.source != "store" or not (store / "store.json").is_file():
        return
    opened = ClipStore(store)
    recorded = recorded_method(opened, "flow")
    if recorded is None:
        return
    differing, fixed = [], []  # (options the study has; what it does not let one choose)
    backend = ALIASES.get(data.flow_backend, data.flow_backend)
    if backend != "auto" and recorded.get("backend") not in (None, backend):
        differing.append(f"data.flow_backend={recorded['backend']} (given {data.flow_backend})")
    bound = stored_bound(opened, "flow")
    if bound is not None and bound != data.flow_bound:
        differing.append(f"data.flow_bound={bound:g} (given {data.flow_bound:g})")
    if recorded.get("mode", "exact") != "exact":
        fixed.append(f"the {recorded['mode']} mode of tvl1-torch (a study extracts flow in the exact mode)")
    params, defaults = recorded.get("params"), to_dict(TVL1Params())
    if params is not None and params != defaults:
        changed = ", ".join(f"{key}={value}" for key, value in params.items() if defaults.get(key) != value)
        fixed.append(f"TV-L1 parameters {changed} (a study extracts flow with OpenCV's defaults)")
    if differing or fixed:
        remedy = "give those values to use it, or another store" if not fixed else "give another store"
        raise ConfigError(f"data.store: the flow view of {store} was extracted with {'; '.join(differing + fixed)}: "
                          f"{remedy}")


def check_gpus(config: StudyConfig) -> None:
    """Refuse ``gpus`` that cannot take effect: indices this machine lacks, or jobs told to train on the CPU (each
    job sees its GPU as its CUDA device; a CPU run ignores it, and the study ran on the CPU without a word); without
    ``gpus``, a ``train.run.device`` this machine lacks (every job failed on it, after the data step)."""
    if not config.gpus:
        from coclr.distributed import pick_device  # noqa: PLC0415 (heavy: torch)

        pick_device((config.train.get("run") or {}).get("device"), "train.run.device")
        return
    count = len(visible_gpus())  # (CUDA_VISIBLE_DEVICES's list where it is set: gpus index into it)
    missing = [gpu for gpu in config.gpus if gpu >= count]
    if missing:
        raise ConfigError(f"gpus: no GPU {', '.join(map(str, missing))} on this machine (it has {count} CUDA "
                          f"device(s){': 0 to ' + str(count - 1) if count else ''}"
                          f"{' of CUDA_VISIBLE_DEVICES' if 'CUDA_VISIBLE_DEVICES' in os.environ else ''}); give those "
                          "it has, or leave gpus out")
    device = str((config.train.get("run") or {}).get("device") or "")
    if device not in ("", "auto") and not device.startswith("cuda"):  # (none, auto: CUDA where there is one)
        raise ConfigError(f"gpus: {config.gpus} given, but the jobs train on {device} (train.run.device): give "
                          "train.run.device=cuda too, or leave gpus out")


def job_threads(config: StudyConfig) -> int | None:
    """The threads of each training and finetuning job (:func:`coclr.jobs.scheduler.run_jobs`): the study's
    ``threads`` where the jobs train on the CPU (their results depend on them); None, their share of the cores,
    where they train on GPUs (the GPU's sums are not the threads'; the cores feed it)."""
    if config.gpus:
        return None
    from coclr.distributed import pick_device  # noqa: PLC0415 (heavy: torch)

    device = pick_device((config.train.get("run") or {}).get("device"), "train.run.device")
    return None if device.type == "cuda" else config.threads


def _run_plan(plan: StudyPlan, started: float) -> dict[str, Any]:
    """Every step of a study whose folder this process holds; returns the ``results.json`` content."""

    config, out = plan.config, plan.out
    for name, options in plan.configs.items():
        atomic_write_text(out / "configs" / f"{name}.yaml", yaml.safe_dump(options, sort_keys=False))
    steps = 5
    print(f"[1/{steps}] data", flush=True)
    prepare_data(plan)
    if any(map(supervised_row, config.rows)):
        write_cross_entropy_init(plan)
    print(f"[2/{steps}] training and finetuning: {len(plan.jobs)} jobs, {config.processes} at a time", flush=True)
    failed = failed_inputs(plan, run_jobs(plan.jobs, out, config.processes, config.gpus, threads=job_threads(config)))
    print(f"[3/{steps}] evaluation: {', '.join(config.columns)} of {len(config.rows)} rows", flush=True)
    rows = evaluate_rows(plan)
    print(f"[4/{steps}] stages of co-training (Figure 4)", flush=True)
    stages = stage_records(plan)
    print(f"[5/{steps}] report", flush=True)
    return write_results(plan, rows, stages, started, failed)


def write_results(plan: StudyPlan, rows: list[dict[str, Any]], stages: list[dict[str, Any]], started: float,
                  failed: list[str] | None = None) -> dict[str, Any]:
    """The report of the rows' records (``table.md``, the gallery, the plots), ``results.json`` and
    ``results.md`` (the table, its notes, the claims, the stages) in the study folder; returns the results. A row
    whose encoder collapsed is marked in each (:func:`coclr.study.results.collapse_warning`); the inputs that
    failed (``failed``: left out) are listed in each (``failed_inputs``)."""

    out, config = plan.out, plan.config
    coclr_rgb = [r for key in ("coclr_rgb", "coclr_two_stream") for row in rows if row["row"] == key
                 for r in row["records"] if r["task"] == "retrieval"]  # the gallery: CoCLR's RGB retrieval
    records = [record for row in rows for record in row.pop("records")]
    write_report(out, [*records, *coclr_rgb[:1]], open_store(plan.store))
    seconds = time.time() - started
    checks = claims(rows, config.columns)
    notes = [f"{row['method']} ({row['view']}): {warning}" for row in rows for warning in row.get("warnings", [])]
    notes += [f"failed and left out: {line}" for line in failed or []]
    results = {"seed": config.seed, "wall_seconds": round(seconds, 1), "columns": list(config.columns),
               "rows": rows, "claims": checks, "stages": stages, "config": dataclasses.asdict(config),
               "failed_inputs": list(failed or [])}
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "results.md", results_markdown(rows, config.columns, checks, seconds, config.seed,
                                                          stages, notes))
    return results


def _seeds_output(path: Path) -> bool:
    """Whether ``path`` is what ``--seeds`` writes into its folder: a seed's study folder or a summary file."""
    return path.name in SEEDS_FILES or (path.is_dir() and path.name.startswith("seed") and path.name[4:].isdigit())


def _summarised_seeds(out: Path) -> list[int] | None:
    """The seeds ``out/seeds.json`` summarises (None: no summary, or one that cannot be read, which is written
    again)."""
    try:
        seeds = json.loads((out / "seeds.json").read_text(encoding="utf-8")).get("seeds")
    except (OSError, ValueError, AttributeError):
        return None
    return seeds if isinstance(seeds, list) else None


def _seed_list(seeds: Sequence[int]) -> str:
    return ", ".join(map(str, seeds))


def run_seeds(config: StudyConfig, out: str | Path, seeds: Sequence[int], check_only: bool = False
              ) -> dict[str, Any] | None:
    """The study once per seed (``OUT/seed<S>``, each resumable), then every number's mean and standard deviation
    and every claim's count of seeds, in ``OUT/seeds.json`` and ``OUT/seeds.md``, and, when CoCLR rows of flow
    record their mined positives' precision, the plot of their gain against it (``OUT/mined_precision_flow.png``).
    ``OUT`` holds nothing else (else it is refused before any work, naming what is there:
    :func:`coclr.runfolder.check_output_folder`)."""
    out = Path(out)
    for seed in seeds:  # (as --seed is: dataclasses.replace checks nothing)
        check_seed(seed, "--seeds")
    if (Path(out) / RUN_RECORD).is_file():  # (it said the study's own files were "not written by coclr study")
        raise FolderRefused(f"{out}: holds a study of one seed; --seeds writes a folder per seed (OUT/seed<S>): give "
                            "another folder, or run it without --seeds to continue it")
    check_output_folder(out, STUDY_FOLDER.command, _seeds_output, "seed<S>/, " + ", ".join(SEEDS_FILES))
    for seed in seeds:  # every seed's folder before any seed's work: not hours of one, then a refusal
        check_study(dataclasses.replace(config, seed=seed), Path(os.path.abspath(out / f"seed{seed}")))
    before = _summarised_seeds(out)
    if before is not None and set(before) != set(seeds):  # (it was rewritten for the seeds given, without a word)
        every = sorted(set(before) | set(seeds))
        print(f"[study] note: {out / 'seeds.json'} summarises seeds {_seed_list(before)}; it will summarise "
              f"{_seed_list(seeds)}, the seeds given (the others' folders are kept: give --seeds "
              f"{' '.join(map(str, every))} to summarise them all)", flush=True)
    results = []
    for seed in seeds:
        print(f"=== seed {seed}", flush=True)
        result = run_study(dataclasses.replace(config, seed=seed), out / f"seed{seed}", check_only)
        if result is not None:
            results.append(result)
    if check_only:
        return None
    summary = summarise_seeds(results)
    summary["failed_inputs"] = {str(result["seed"]): result["failed_inputs"] for result in results
                                if result.get("failed_inputs")}  # (each seed's results.md lists them)
    summary["all_collapsed"] = [str(result["seed"]) for result in results
                                if every_row_collapsed(result["rows"])]
    atomic_write_json(out / "seeds.json", summary)
    atomic_write_text(out / "seeds.md", seeds_markdown(summary))
    if summary.get("mining"):
        plot_mining(summary["mining"], out / MINING_PLOT)
    return summary
