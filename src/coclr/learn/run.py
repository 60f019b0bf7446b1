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
same folder with other videos (or videos changed since) or options is refused before any work naming what
differs, and a finished run
returns at once without writing anything. Unreadable videos are listed and left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coclr import progress
from coclr.atomic import atomic_duplicate, atomic_write_json, file_identity, read_json_record
from coclr.config import from_dict
from coclr.curate.groups import stretches_text
from coclr.embed.inputs import expand_inputs
from coclr.errors import CoclrError, ConfigError, DataError
from coclr.flow.encode import FLOW_BOUND
from coclr.interrupts import interrupted
from coclr.learn.budget import (
    MIN_VIDEOS,
    MODELS,
    Footage,
    Plan,
    choose_plan,
    infonce_side_by_side,
    measure_costs,
    measured_bound_reason,
    require_videos,
    size_stage,
)
from coclr.learn.init import Start, copy_starts, read_starts, recorded_starts, start_file, start_model
from coclr.learn.line import MeasureLine, ProgressLine
from coclr.learn.options import LearnOptions, budget_text
from coclr.learn.recipe import pipeline_options, sized
from coclr.learn.scores import read_labels
from coclr.learn.stages import VIEWS, choose_exports, export_line, videos_learnt
from coclr.runfolder import (
    FolderRule,
    check_folder,
    check_restart,
    check_writable,
    claim_folder,
    held_before_claim,
    read_record,
)
from coclr.text import TEXT, shown, to_bytes
from coclr.threads import torch_threads, usable_cores
from coclr.video.indexes import is_relative_key, unlabelled_index


def _as_typed(options: dict[str, Any]) -> dict[str, Any]:
    """A learn folder's settings as a refusal names them: the budget as ``--budget`` takes it (``8m``)."""
    budget = options.get("budget")
    return {**options, "budget": budget_text(budget)} if isinstance(budget, (int, float)) else options


LEARN_FOLDER = FolderRule("learn", "a learn run", may_differ=("labels", "device", "workers"), restart=True,
                          rooted=True, shown=_as_typed)
"""How a learn folder is continued or refused (:mod:`coclr.runfolder`): the videos, the budget and the seed
decide what it holds; the labels (only scored), the device and the workers may change."""
INPUTS_FILE = "inputs.json"
PLAN_FILE = "plan.json"
RESULT_FILE = "learn.json"
LOG_FILE = "learn.log"
EMBEDDINGS = ("rgb", "flow", "two_stream")
SOURCES = {"rgb": ("rgb",), "flow": ("flow",), "two_stream": ("rgb", "flow")}
"""The encoders each embedding comes from."""
CURATE_FOLDER = "curate"
"""``OUT/curate``: the two-stream embeddings' near-duplicates, outliers and map (``coclr curate``)."""
CLOCK_SECONDS = 5.0
"""How often a running job records the seconds it has taken in ``learn.json`` (a kill loses at most these)."""


@dataclasses.dataclass
class LearnSummary:
    """What a run did: where, the videos learnt from and those left out (path, reason), the seconds it took
    (this time, and in all), and whether it had finished before (nothing done)."""

    out: Path
    videos: int
    failed: list[tuple[str, str]]
    seconds: float
    """the seconds of every part of the run (a continued run's earlier parts included)"""
    already_done: bool = False
    record: dict[str, Any] = dataclasses.field(default_factory=dict)
    rescored: bool = False
    """finished before, and scored again with other labels (or none): no learning done"""

    @property
    def collapsed_views(self) -> list[str]:
        """The views whose every stage collapsed (their exported encoder carries nothing)."""
        return [view for view, entry in self.record.get("exported", {}).items() if entry.get("collapsed")]

    def __str__(self) -> str:
        lines = []
        if self.already_done:
            lines.append(f"{self.out}: finished before; nothing to do")
        elif self.rescored:
            lines.append(f"{self.out}: finished before (learnt in {progress.duration(self.seconds)}); its measures "
                         "taken again with the labels given" if self.record.get("labels") else
                         f"{self.out}: finished before (learnt in {progress.duration(self.seconds)}); its label "
                         "scores dropped (no --labels given)")
        else:
            learnt = videos_learnt(self.record)
            learnt = self.videos - len(self.failed) if learnt is None else learnt
            lines.append(f"{self.out}: learnt from {learnt} videos in {progress.duration(self.seconds)}")
        lines.append(f"  encoders: {self.out / 'encoder_rgb.pth'}, {self.out / 'encoder_flow.pth'}")
        lines.append(f"  embeddings: {', '.join(str(self.out / 'embeddings' / name) for name in EMBEDDINGS)} "
                     f"(coclr search {shlex.quote(str(self.out / 'embeddings' / 'two_stream'))} --query VIDEO)")
        lines.append(f"  report: {self.out / 'report.html'}; every figure in {self.out / RESULT_FILE}")
        curated = self.record.get("curate")
        if curated:
            lines.append(f"  near-duplicates, outliers and a map: {self.out / CURATE_FOLDER / 'index.html'} "
                         f"({curated['groups']} duplicate group(s), "
                         f"{stretches_text(curated['partial_pairs'], curated.get('stretches'))})")
        for name, scores in (self.record.get("labels") or {}).get("embeddings", {}).items():
            lines.append(f"  with the given labels, {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in scores.items()
                                                                       if isinstance(v, float)))
        for note in (self.record.get("labels") or {}).get("notes", []):
            lines.append(f"  {note}")
        collapsed = [stage for stage, entry in self.record.get("stages", {}).items() if entry.get("collapsed")]
        if collapsed:
            lines.append(f"  collapsed (features without spread): {', '.join(collapsed)}; their encoders carry "
                         "nothing")
        short = self.record.get("short_videos", [])
        if short:
            lines.append(f"  {len(short)} video(s) shorter than one clip, padded by repeating their last frame: "
                         f"{', '.join(short[:3])}{' ...' if len(short) > 3 else ''}")
        for view, entry in (self.record.get("plan") or {}).get("init", {}).items():
            start = (self.record.get("stages") or {}).get(f"init_{view}") or {}
            scored = (start.get("labels") or {}).get("R@1")
            lines.append(f"  {view} started from {entry['source']}" + (f" (R@1 {scored:.1f} before learning)"
                                                                       if scored is not None else ""))
        if self.record.get("exported"):
            lines.append(f"  {export_line(self.record['exported'])}")
        for view in self.collapsed_views:
            lines.append(f"  every {view} stage collapsed: encoder_{view}.pth and the embeddings from it carry "
                         f"nothing; try a longer --budget, or more (or longer) videos")
        if self.failed:
            lines.append(f"  {len(self.failed)} video(s) left out of what failed for them (all of it when their "
                         "frames could not be read; training and the flow embeddings when only their flow failed):")
            lines += [f"    {message}" for _, message in self.failed[:20]]
            if len(self.failed) > 20:
                lines.append(f"    ... and {len(self.failed) - 20} more, listed in {self.out / RESULT_FILE}")
        return "\n".join(map(shown, lines))


def paths_digest(paths: Sequence[str]) -> str:
    return hashlib.sha256(to_bytes("\n".join(paths))).hexdigest()


def learn(inputs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
          options: LearnOptions | None = None) -> LearnSummary:
    """Learn from the videos named by ``inputs`` (:func:`~coclr.embed.inputs.expand_inputs`: files, folders,
    list files, globs) into the folder ``out`` (see the module docstring). Raises a
    :class:`~coclr.errors.CoclrError` in one line before any work for bad inputs or options, a folder of other
    videos or options, or a budget too small."""
    options = options or LearnOptions()
    options.validate()
    started = time.perf_counter()
    out = Path(out)
    notes: list[str] = []
    paths = [str(path) for path in expand_inputs(inputs, notes)]
    missing = [path for path in paths if not os.path.isfile(path)  # named by a list file: a typo, or moved away
               and not os.path.islink(path)]  # (a link to nothing, found in a folder, is that input's failure)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise DataError(f"{len(missing)} video(s) a list file names do not exist: {', '.join(missing[:3])}{more}; "
                        "mend the list (or remove those lines) and run again")
    if len(paths) < MIN_VIDEOS:  # (the readable ones are counted once the videos are probed)
        raise ConfigError(f"{len(paths)} video(s): learning needs at least {MIN_VIDEOS} (each batch contrasts a video "
                          "with the others); give more videos")
    root = common_root(paths)
    named = [path for path in paths if not is_relative_key(os.path.relpath(path, root))]  # (the index's rule)
    if named:  # (refused by the store's index after the measurement, naming no remedy)
        more = f" and {len(named) - 1} more" if len(named) > 1 else ""
        raise DataError(f"{shown(named[0])}{more}: a name with a backslash, which the clip store cannot hold (it names "
                        "videos by '/'-separated paths); rename it, or leave it out, and run again")
    labels, label_notes = read_labels(options.labels, paths) if options.labels else (None, [])
    starts = read_starts(options.init, options.flow_init)
    record_options = {"videos": {"count": len(paths), "sha256": paths_digest(paths)},
                      "budget": float(options.budget), "seed": options.seed,
                      "labels": options.labels and os.path.abspath(options.labels), "device": options.device,
                      "workers": options.workers}
    if starts:  # (a run from scratch records no key: folders made before --init continue)
        record_options["init"] = recorded_starts(starts)
    check_inputs(out, paths, options.restart, record_options)
    if options.restart:  # (a folder --restart may not move: refused now, not after the measurement)
        check_restart(out, LEARN_FOLDER)
    elif check_folder(out, LEARN_FOLDER, record_options):  # reads only
        result = read_result(out)
        if result.get("status") == "done" and result.get("labels_file") == record_options["labels"] and \
                result.get("labels_sha256") == (labels and labels["sha256"]):
            failed = [(item["path"], item["error"]) for item in result.get("failed", [])]
            _join_when_launched(options)
            return LearnSummary(out, len(paths), failed, result.get("seconds", 0.0), True, result)
    check_writable(out)  # before the measurement: a folder that cannot be written is one line at once
    from coclr.distributed import (  # noqa: PLC0415 (heavy: torch)
        barrier,
        broadcast_object,
        init_distributed,
        launched_rank,
        pick_device,
    )
    from coclr.train.config import check_device_name  # noqa: PLC0415 (heavy: torch)

    if options.device is not None:  # (its training runs' rule, before any work: they refused it after the probe)
        check_device_name(options.device, "--device")
    device = pick_device(options.device, "--device")
    earlier = {} if options.restart else read_result(out)
    # a finished run given other labels (or none) is scored again: that is not learning time (the report said
    # "learnt in 5 min of a 3 min budget"), so its clock stands still
    clock = Clock(out, earlier.get("seconds", 0.0), started, counting=earlier.get("status") != "done")
    with contextlib.ExitStack() as held:
        refused, plan = None, None
        if launched_rank() == 0:  # makes the plan and holds the folder before the other processes join it
            try:
                held.enter_context(held_before_claim(out, LEARN_FOLDER))  # before the measurement, not after it
                plan = (None if options.restart else read_plan(out)) or given_plan(options.plan, starts) or make_plan(
                    paths, options.budget, device, options.workers, time.perf_counter() - started, options.progress,
                    starts)
                held.enter_context(claim_folder(out, LEARN_FOLDER, record_options, restart=options.restart))
                record_start(out, paths, [*notes, *label_notes], plan, clock, starts)
            except CoclrError as error:
                refused = error
        init_distributed(device)  # under torchrun the other processes wait here for rank 0
        message, plan = broadcast_object((None if refused is None else str(refused), plan))
        if message is not None:
            raise refused if refused is not None else ConfigError(message)
        summary = _learn(out, paths, labels, label_notes, options, plan, device, clock)
        barrier()
    return summary


def _join_when_launched(options: LearnOptions) -> None:
    """Under torchrun, join the job's group as the path that learns does (a process refused before it, e.g. on a
    machine without the labels file, waits there to tell the others); nothing in one process (no torch loaded)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    from coclr.distributed import init_distributed, pick_device  # noqa: PLC0415 (heavy: torch)

    init_distributed(pick_device(options.device, "--device"))


def given_plan(plan: Plan | None, starts: dict[str, Start]) -> Plan | None:
    """A plan given to follow (tests), with the starting checkpoints' record; refused when it is of another
    network than theirs."""
    if plan is None or not starts:
        return plan
    model = start_model(starts)
    if plan.model != model:
        raise ConfigError(f"the given plan's network ({plan.model}) is not the starting checkpoint's ({model})")
    return with_starts(dataclasses.replace(plan, reasons=list(plan.reasons)), starts)


def with_starts(plan: Plan, starts: dict[str, Start]) -> Plan:
    """``plan`` recording its starting checkpoints, with a flow checkpoint's flow bound (its inputs' clipping)."""
    plan.init = {view: start.record() for view, start in starts.items()}
    if "flow" in starts:
        if plan.flow_bound is not None:  # (the footage's bound, said before: not the one used)
            measured = measured_bound_reason(plan.flow_bound)
            plan.reasons = [reason.replace(f"; {measured}", "") for reason in plan.reasons]
        plan.flow_bound = starts["flow"].flow_bound
        plan.reasons.append(f"flow clipped to +-{plan.flow_bound:g} px, as the starting flow checkpoint's inputs were")
    return plan


def record_start(out: Path, paths: list[str], notes: list[str], plan: Plan, clock: Clock,
                 starts: dict[str, Start]) -> None:
    """Write what a run follows, once: its inputs, its plan (the plan is made before the folder is claimed, so
    that a refused budget leaves no folder behind) and its starting encoders, and the seconds taken so far."""
    for note in notes:
        say(note)
    copy_starts(out, starts)
    if not (out / INPUTS_FILE).is_file():
        write_inputs_record(out, paths)
    if not (out / PLAN_FILE).is_file():
        atomic_write_json(out / PLAN_FILE, plan.to_dict())
    clock.record(read_result(out))


def _learn(out: Path, paths: list[str], labels: dict[str, Any] | None, label_notes: list[str],
           options: LearnOptions, plan: Plan, device, clock: Clock) -> LearnSummary:
    """Every phase; the parts run by every process of a torchrun job, what is written once by rank 0."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.distributed import barrier, is_main, world_size  # noqa: PLC0415 (heavy: torch)
    from coclr.train.pipeline import plan_stages, run_pipeline  # noqa: PLC0415

    main = is_main()
    result = read_result(out) if main else {}
    if main and clock.counting:
        say(plan.describe())
    elif main:  # (a finished run scored again: its phases are done, so a bar's time left would be theirs)
        say(f"coclr learn: {out} finished before; " + ("its measures taken again with the labels given" if labels
                                                       else "its label scores dropped (no --labels given)")
            + " (no time counted)")
    result["status"] = "running"
    finished = [name for name in result.get("phases_done", []) if name in plan.estimates]  # by earlier parts
    line = ProgressLine(plan.estimates, enabled=options.progress and main and clock.counting,
                        done=("measure", *finished),
                        took={name: result["phases"][name] for name in finished}, before=clock.seconds(),
                        tick=(lambda: clock.record(result, due=True)) if main else None,
                        sized=("coclr",))  # (each CoCLR stage is sized to the time left as it starts)
    log = open(out / LOG_FILE if main else os.devnull, "a", **TEXT)  # the parts' lines: the log's, not the terminal's
    with log, line, progress.observed(line.observe), contextlib.redirect_stdout(log):
        record = (lambda name: timed(clock, result, name)) if main else (lambda name: contextlib.nullcontext())
        root = common_root(paths)
        with line.phase("store", len(paths)), record("store"):
            store = build_learn_store(out, root, paths, plan, options.workers)
        with line.phase("flow", flow_pairs(store)), record("flow"):
            flow_failed = extract_learn_flow(store, root, options.workers, plan.flow_bound or FLOW_BOUND)
        config = pipeline_config(out, store, plan, options.seed, str(device), usable_instances(store, plan),
                                 world_size())
        stages = plan_stages(config)
        side_by_side = infonce_side_by_side(device, world_size())
        # the bars' units: the side-by-side scheduler's counts both stages' epochs, the pipeline's count steps
        infonce_units = sum(s.epochs for s in stages[:2]) if side_by_side else plan.stage_steps(stages[:2])
        with line.phase("infonce", infonce_units), record("infonce"):
            if side_by_side:
                train_side_by_side(out, config, stages[:2])
            run_pipeline(config, until=stages[1].name)
        with line.phase("coclr", plan.stage_steps(stages[2:])), record("coclr"), torch_threads(plan.threads):
            train_coclr(out, config, plan, stages, clock, result, line)
        if main:
            with line.phase("quality", None), record("quality"), torch_threads(plan.inference_threads):
                result["stages"], result["agreement"] = measure_stages(out, store, config, plan, str(device),
                                                                       labels, root)
            result["exported"] = choose_exports(result["stages"])
            export_encoders(out, result["exported"])
            say(export_line(result["exported"]))
        barrier()
        with line.phase("embed", 2 * len(paths)), record("embed"):
            embed_failed = embed_all(out, paths, str(device), options.workers)
        if not main:
            return LearnSummary(out, len(paths), [], clock.seconds())
        result["embeddings"] = embedding_quality(out, result["exported"])
        with line.phase("curate", None), record("curate"):
            result["curate"] = curate_embeddings(out, str(device), options.workers, plan.curate_videos)
        if labels is not None:
            from coclr.learn.scores import label_scores  # noqa: PLC0415

            scored = label_scores(out, labels)
            result["labels"] = {**scored, "notes": [*label_notes, *scored["notes"]]}
        else:  # a run scored before and continued without --labels: no scores of a file no longer given
            result.pop("labels", None)
        untrained = {**flow_failed, **store_failures(store, root)}  # (a video embedding failed on was trained on;
        # the store's reason first: a video that could not be decoded failed in flow too, "no 'rgb' entry")
        failed = sorted({**embed_failed, **untrained}.items())  # (why it was not trained on: the first cause)
        result.update(status="done", plan=plan.to_dict(), labels_file=labels and labels["file"],
                      trained_videos=len(paths) - len(untrained),
                      labels_sha256=labels and labels["sha256"],
                      failed=[{"path": path, "error": error} for path, error in failed],
                      short_videos=[path for path in plan.short_videos if path not in untrained],  # (padded and
                      videos=len(paths), torch=torch.__version__)  # trained on: not those left out of training)
        with line.phase("fixed", None):
            from coclr.learn.report import write_report  # noqa: PLC0415

            result["seconds"] = clock.seconds()
            write_report(out / "report.html", out, result, paths)
        clock.record(result)
    return LearnSummary(out, len(paths), failed, result["seconds"], record=result, rescored=not clock.counting)


# ------------------------------------------------------------------------------------------------ the parts


def say(text: str) -> None:
    """A line for the person running the command (never into the log the parts write to)."""
    progress.write(text, file=sys.__stdout__)


class Clock:
    """The seconds a run has taken in all: those its earlier parts recorded (``before``) and this part's since
    ``started`` (a ``time.perf_counter()``), recorded in ``learn.json`` (:meth:`record`)."""

    def __init__(self, out: Path, before: float, started: float, counting: bool = True) -> None:
        self.out, self.before, self.started, self.counting = out, before, started, counting
        self.recorded = time.monotonic()
        self.running: tuple[str, float, float] | None = None
        """The phase under way (:func:`timed`): its name, the seconds earlier parts gave it, and when it began."""

    def seconds(self) -> float:
        return self.before + (time.perf_counter() - self.started if self.counting else 0.0)

    def record(self, result: dict[str, Any], due: bool = False) -> None:
        """Write ``result`` with the seconds so far to ``learn.json`` (with ``due``: only every
        :data:`CLOCK_SECONDS`, and only from the main thread, which alone writes it)."""
        if due and (time.monotonic() - self.recorded < CLOCK_SECONDS
                    or threading.current_thread() is not threading.main_thread()):
            return
        self.recorded = time.monotonic()
        result["seconds"] = self.seconds()
        if self.running is not None and self.counting:  # its seconds so far: a kill -9 keeps them too
            name, before, begin = self.running
            result.setdefault("phases", {})[name] = before + time.perf_counter() - begin
        atomic_write_json(self.out / RESULT_FILE, result)


@contextlib.contextmanager
def timed(clock: Clock, result: dict[str, Any], name: str) -> Iterator[None]:
    """Add the seconds of the block to ``result["phases"][name]`` and record them in ``learn.json`` (a resumed run
    adds to what the earlier ones took; the clock's records while it runs hold its seconds so far, so that a part
    killed outright keeps them to its last record); a block that ends without an error is added to
    ``result["phases_done"]`` (what a resumed run's progress line counts as done)."""
    phases = result.setdefault("phases", {})
    begin, before = time.perf_counter(), phases.get(name, 0.0)
    clock.running = (name, before, begin)
    ended = False
    try:
        yield
        ended = True
    finally:
        clock.running = None
        phases = result.setdefault("phases", {})
        phases[name] = before + (time.perf_counter() - begin if clock.counting else 0.0)
        done = result.setdefault("phases_done", [])
        if ended and name not in done:
            done.append(name)
        clock.record(result)


def read_result(out: Path) -> dict[str, Any]:
    """What the run in ``out`` has finished so far (``learn.json``), empty before its first part."""
    return read_json_record(out / RESULT_FILE) or {}


def read_plan(out: Path) -> Plan | None:
    """The plan the run in ``out`` chose (``plan.json``), None before it chose one."""
    record = read_json_record(out / PLAN_FILE)
    return None if record is None else Plan.from_dict(record)


def write_inputs_record(out: Path, paths: list[str]) -> None:
    """``inputs.json``: the videos a run learns from, and each one's identity (size and modification time: one
    changed since is refused by :func:`check_inputs`)."""
    atomic_write_json(out / INPUTS_FILE, {"videos": paths, "identities": {
        path: list(identity) for path in paths if (identity := file_identity(path)) is not None}})


def _some(names: list[str]) -> str:
    """The first three of ``names``, and " ..." when there are more."""
    return f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"


def changed_since(out: Path, paths: list[str], identities: dict[str, list[int]]) -> list[str]:
    """The videos of ``paths`` whose file is not the one the run recorded (``identities``: size and modification
    time): by the store's rule (:func:`coclr.store.build.changed_videos`), a file touched or copied without its times
    whose content is the one its store entry noted (its sha256) is the same video. Reads only."""
    from coclr.atomic import file_sha256  # noqa: PLC0415
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    suspects = [path for path in paths if path in identities and list(file_identity(path) or ()) != identities[path]]
    if not suspects:
        return []
    try:
        noted = ClipStore(out / "store").notes("rgb") if (out / "store").is_dir() else {}
    except DataError:
        noted = {}
    root = common_root(paths)

    def same(path: str) -> bool:
        identity, note = file_identity(path), noted.get(os.path.relpath(path, root), {})
        return (identity is not None and identity[0] == identities[path][0] and "sha256" in note
                and file_sha256(path) == note["sha256"])

    return [path for path in suspects if not same(path)]


def check_inputs(out: Path, paths: list[str], restart: bool, options: dict[str, Any]) -> None:
    """Refuse a folder that learnt from other videos, naming those added and removed, and those whose file changed
    since (their size or modification time: the run's encoders and embeddings are of what they were; a finished
    run said "nothing to do"), with every other option that differs (``options``, as the folder records them),
    before any work."""
    record = read_record(out) if out.is_dir() else None
    inputs = out / INPUTS_FILE
    if restart or record is None or record.get("command") != LEARN_FOLDER.command or not inputs.is_file():
        return
    recorded = read_json_record(inputs) or {}
    before, identities = recorded.get("videos"), recorded.get("identities") or {}
    added = [p for p in paths if p not in set(before)]
    removed = [p for p in before if p not in set(paths)]
    changed = changed_since(out, paths, identities)
    parts = [f"{len(added)} added ({_some(added)})" if added else "",
             f"{len(removed)} removed ({_some(removed)})" if removed else "",
             "in another order" if not added and not removed and before != paths else "",
             f"{len(changed)} changed since ({_some(changed)}): its encoders and embeddings are of their earlier "
             "content" if changed else ""]
    if not any(parts):
        return
    others = [line for line in LEARN_FOLDER.differing(record["options"], options) if not line.startswith("videos")]
    also = f"; and other options: {', '.join(others)}" if others else ""
    same = ("give the same videos" + (", restored," if changed else "") + (" and options" if others else "")
            + " to continue it")
    raise ConfigError(f"{out} learnt from other videos: {'; '.join(p for p in parts if p)}{also}; {same}, another "
                      "--out, or --restart to move it aside and start over")


def make_plan(paths: list[str], budget: float, device, workers: int | None, spent: float,
              show: bool = True, starts: dict[str, Start] | None = None) -> Plan:
    """Probe the videos, measure this machine and choose the plan (:mod:`coclr.learn.budget`) for the processes
    and machines of the job (with ``starts``, of the starting checkpoints' network and clips, and a flow
    checkpoint's flow bound); ``show``: a progress line while measuring. Refused in one line when most videos are
    shorter than one clip of the plan's network; the plan lists the others that are."""
    starts = starts or {}
    fixed = start_model(starts)
    from coclr.distributed import launched_machines, launched_world_size  # noqa: PLC0415 (heavy: torch)
    from coclr.video.decode import probe_video  # noqa: PLC0415

    say(f"coclr learn: probing {len(paths)} videos and measuring this machine for the budget ...")
    begin = time.perf_counter()
    infos, probed, unreadable = [], [], []
    with MeasureLine(len(paths), enabled=show) as line:
        for path in paths:
            line.probed()
            try:
                infos.append(probe_video(path))
                probed.append(path)
            except Exception:  # an unreadable video is the store job's failure, listed there
                unreadable.append(path)
        if not infos:
            raise DataError("none of the videos could be read (not a video, or damaged): check the inputs")
        require_videos(len(infos), unreadable)  # (before the measurement, not a minute later)
        short_videos(fixed.length if fixed else min(model.length for model in MODELS), probed, infos)  # refused
        footage = Footage.of(infos)  # (before measuring) when most are shorter than the shortest clip
        workers = job_workers(workers)
        spent += time.perf_counter() - begin
        try:
            costs = measure_costs(paths, footage, device, workers, budget - spent, launched_world_size(),
                                  launched_machines(), line.measuring, fixed)
        except KeyboardInterrupt as error:  # (its timing jobs said "flow: 32 of 32 videos done and kept": their own
            stopped = interrupted(error, "")  # temporary folders' videos, removed with them)
            stopped.kept = "it was measuring this machine for the plan, which nothing keeps"
            raise stopped from None
    plan = choose_plan(footage, costs, budget, spent + costs.seconds, fixed)
    plan.short_videos = short_videos(plan.model.length, probed, infos)
    return with_starts(plan, starts)


def short_videos(length: int, paths: list[str], infos: list) -> list[str]:
    """The videos shorter than one clip of ``length`` frames and its flow (they are padded by repeating their last
    frame); refused in one line when they are most of them."""
    from coclr.data.sampling import clip_span  # noqa: PLC0415

    needed = clip_span(length, 1) + 1
    short = [path for path, info in zip(paths, infos) if info.frames < needed]
    if len(short) > len(paths) / 2:
        raise DataError(f"{len(short)} of the {len(paths)} videos are shorter than one clip ({needed} frames with its "
                        f"flow, e.g. {short[0]}): too short to learn motion from; give longer videos")
    return short


def job_workers(workers: int | None) -> int:
    """Processes of the store and flow jobs: as given, else one per core."""
    return max(1, workers if workers is not None else usable_cores())


def common_root(paths: list[str]) -> str:
    """The deepest folder holding every path."""
    return os.path.commonpath([os.path.dirname(path) for path in paths])


def flow_pairs(store: Path) -> int:
    """The frame pairs of the stored videos' flow: the units of the flow job's bar (it counts pairs, not videos of
    any length), at least one a video, as it counts them."""
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415 (heavy: torch)

    clips, pairs = ClipStore(store), 0
    for key in clips.keys():
        try:
            pairs += max(1, clips.num_frames(key, "rgb") - 1) if clips.has(key, "rgb") else 1
        except Exception:  # noqa: BLE001 (a damaged entry: its flow's failure says why)
            pairs += 1
    return pairs


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

    failed = ClipStore(store).failed_inputs("rgb", "flow")
    return {os.path.join(root, key): reason for key, reason in failed.items()}


def extract_learn_flow(store: Path, root: str, workers: int | None, bound: float) -> dict[str, str]:
    """TV-L1 flow of every stored video (the fastest exact TV-L1 here: our C loops, Triton on a GPU; clipped to
    +-``bound`` px); returns the videos it failed for (path -> reason)."""
    from coclr.store.flow_extract import extract_flow  # noqa: PLC0415 (heavy: torch)

    summary = extract_flow(store, backend="auto", workers=workers, bound=bound)
    print(summary, flush=True)
    return {os.path.join(root, key): reason for key, reason in summary.failed}


def usable_instances(store: Path, plan: Plan) -> int:
    """Training instances of the store's usable videos under ``plan`` (its videos, or their stretches)."""
    from coclr.data.datasets import TrainClips  # noqa: PLC0415 (heavy: torch)

    return len(TrainClips(store, "train", list(VIEWS), plan.model.length, segment_frames=plan.segment_frames))


def pipeline_config(out: Path, store: Path, plan: Plan, seed: int, device: str, instances: int, processes: int):
    """The pipeline of the plan (``OUT/pipeline``): InfoNCE on both views, then two CoCLR cycles, by ``processes``
    processes, over ``instances`` training instances."""
    from coclr.train.config import PipelineConfig  # noqa: PLC0415 (heavy: torch)

    starts = {view: str(start_file(out, view)) for view in plan.init}
    return from_dict(PipelineConfig, pipeline_options(plan, str(store), str(out / "pipeline"), seed, device,
                                                      instances, processes, starts))


def train_side_by_side(out: Path, config, stages) -> None:
    """Train the InfoNCE ``stages`` at once, each a pretraining task in a child process of one thread (as a study
    runs them: the pipeline then finds them done; one thread, as the plan timed them, and a result that does not
    depend on the machine's cores), their output in ``OUT/logs``."""
    from coclr.config import merge, to_dict  # noqa: PLC0415
    from coclr.jobs.scheduler import Job, run_jobs  # noqa: PLC0415
    from coclr.jobs.tasks import Pretrain  # noqa: PLC0415
    from coclr.train.config import PretrainConfig  # noqa: PLC0415
    from coclr.train.pipeline import stage_config  # noqa: PLC0415

    jobs = []
    for stage in stages:
        options = merge(to_dict(stage_config(config, stage, Path(config.run.out))), {"run": {"progress": False}})
        jobs.append(Job(stage.name, Pretrain(from_dict(PretrainConfig, options)), (), stage.epochs,
                        (Path(config.run.out) / stage.name,)))
    run_jobs(jobs, out, processes=len(jobs), desc="InfoNCE", threads=1)


def train_coclr(out: Path, config, plan: Plan, stages: list, clock: Clock, result: dict[str, Any],
                line: ProgressLine) -> None:
    """Train the CoCLR stages in turn (``stages``: the pipeline's, the two InfoNCE stages first), each sized as it
    starts when the plan fits the budget (:func:`~coclr.learn.budget.size_stage`, at the seconds an epoch the
    stages trained in this process took): its epochs are written to ``plan.json`` before it trains (a continued
    stage keeps them) and what they were chosen from to ``learn.json`` (``sizing``)."""
    from coclr.distributed import broadcast_object, is_main  # noqa: PLC0415 (heavy: torch)
    from coclr.train.pipeline import epoch_seconds, run_pipeline  # noqa: PLC0415

    planned, stages = plan.stage_steps(stages[2:]), list(stages)
    took: list[tuple[float, int]] = []  # (seconds, epochs) of the stages trained in this process
    for number in range(2, len(stages)):
        stage = stages[number]
        if plan.fit_budget:
            if stage.name not in plan.stage_epochs:
                chosen = None
                if is_main():
                    measured = sum(t for t, _ in took) / sum(e for _, e in took) if took else None
                    chosen, why = size_stage(plan, clock.seconds(), result.get("phases", {}), len(stages) - number,
                                             measured)
                    plan.stage_epochs[stage.name] = chosen
                    atomic_write_json(out / PLAN_FILE, plan.to_dict())
                    result.setdefault("sizing", {})[stage.name] = why
                    clock.record(result)  # (now: a kill before the next record lost why for good)
                plan.stage_epochs[stage.name] = broadcast_object(chosen)
            stages[number] = sized(stage, plan.stage_epochs[stage.name])
            steps = plan.stage_steps(stages[2:])
            line.resize(steps, plan.estimates["coclr"] * steps / max(1, planned))
        run_dir = Path(config.run.out)
        before, begin = len(epoch_seconds(run_dir, stage.name)), time.perf_counter()
        run_pipeline(config, until=stage.name, stages=stages)
        trained = len(epoch_seconds(run_dir, stage.name)) - before
        if trained > 0:
            took.append((time.perf_counter() - begin, trained))


def export_encoders(out: Path, exported: dict[str, dict[str, Any]]) -> None:
    """``OUT/encoder_<view>.pth``: each view's exported stage's encoder (:func:`~coclr.learn.stages.choose_exports`),
    duplicated atomically; and ``OUT/encoder_<view>.safetensors``, the same as safetensors with its config
    (:mod:`coclr.models.export`). Each is written only when it does not hold those bytes already."""
    from coclr.models.export import save_safetensors  # noqa: PLC0415 (heavy: torch)
    from coclr.models.loading import load_encoder, open_checkpoint  # noqa: PLC0415

    for view, entry in exported.items():
        source = stage_encoder(out, entry["stage"], view)
        target = out / f"encoder_{view}.pth"
        if not (target.is_file() and target.read_bytes() == source.read_bytes()):
            atomic_duplicate(source, target)
        backbone, head = load_encoder(target)
        save_safetensors(out / f"encoder_{view}.safetensors", backbone, head,
                         open_checkpoint(target).payload.get("meta") or {})


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
    failed.update(dict(summary.failed_before + summary.failed))  # failed before: skipped, still left out
    both = Embedder(rgb, device=device, workers=workers, flow_checkpoint=flow)
    flow_alone = Embedder(flow, device=device, workers=workers)
    summary = embed_videos(paths, out / "embeddings" / "two_stream", both, progress=False,
                           streams={1: (out / "embeddings" / "flow", flow_alone)})
    print(summary, flush=True)
    failed.update(dict(summary.failed_before + summary.failed))
    return failed


def stage_encoder(out: Path, stage: str, view: str) -> Path:
    """The encoder file of a stage of the run in ``out``: a pipeline stage's, or (``init_<view>``) the starting
    one's copy."""
    from coclr.train.pipeline import encoder_file  # noqa: PLC0415 (heavy: torch)

    return start_file(out, view) if stage == f"init_{view}" else encoder_file(out / "pipeline", stage, view)


def measure_stages(out: Path, store: Path, config, plan: Plan, device: str, labels: dict[str, Any] | None,
                   root: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The label-free measures of every stage's encoder (the starting ones first) on the stored videos (a sample
    of large footage) and the views' agreement (:func:`~coclr.learn.stages.stage_quality`); with ``labels``
    (never used to choose), each stage's R@k on the labelled videos of the sample too."""
    from coclr.eval.features import ClipConfig  # noqa: PLC0415 (heavy: torch)
    from coclr.learn.budget import QUALITY_VIDEOS  # noqa: PLC0415
    from coclr.learn.scores import stage_scorer  # noqa: PLC0415
    from coclr.learn.stages import sample_keys, stage_quality  # noqa: PLC0415
    from coclr.train.pipeline import Stage, plan_stages  # noqa: PLC0415
    from coclr.train.timing import INFERENCE_BATCH  # noqa: PLC0415

    clips = ClipConfig(length=config.data.length, stride=config.data.stride, size=config.data.size,
                       batch_size=INFERENCE_BATCH)  # the unit the calibration timed
    starts = [Stage(f"init_{view}", "init", [view], 0, 0, []) for view in plan.init]
    scorer = stage_scorer(labels, root) if labels is not None else None
    return stage_quality(lambda stage, view: stage_encoder(out, stage, view), store, [*starts, *plan_stages(config)],
                         clips, device, sample_keys(store, QUALITY_VIDEOS), config.data.segment_frames, scorer)


def curate_embeddings(out: Path, device: str, workers: int | None, videos: int | None = None) -> dict[str, Any]:
    """``coclr curate`` of the two-stream embeddings into ``OUT/curate`` (the threshold calibrated on altered copies
    of ``videos`` videos, the plan's; None: :data:`~coclr.learn.budget.CURATE_VIDEOS`; 0, and in a job of several
    processes: by the distribution rule); returns what ``learn.json`` records of it."""
    from coclr.curate.run import RESULT_FILE as CURATE_RESULT  # noqa: PLC0415 (heavy: torch)
    from coclr.curate.run import CurateOptions, curate  # noqa: PLC0415
    from coclr.distributed import world_size  # noqa: PLC0415
    from coclr.learn.budget import CURATE_VIDEOS  # noqa: PLC0415

    # Under torchrun only this process curates: the calibration's embedding would wait for the others (it shares
    # its videos with every process of a group), so there the distribution rule sets the threshold.
    calibrate = (CURATE_VIDEOS if videos is None else videos) if world_size() == 1 else 0
    options = CurateOptions(calibrate=calibrate, device=device, workers=workers)
    curate(out / "embeddings" / "two_stream", out / CURATE_FOLDER, options, show=False)
    record = read_json_record(out / CURATE_FOLDER / CURATE_RESULT) or {}
    return {key: record.get(key) for key in ("threshold", "rule", "groups", "duplicate_videos", "partial_pairs",
                                             "stretches")}


def embedding_quality(out: Path, exported: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The label-free measures of each embedding folder's video vectors; ``collapsed`` when its own vectors are,
    or an encoder it comes from collapsed (``encoder_collapsed``)."""
    from coclr.embed.search import Embeddings  # noqa: PLC0415 (heavy: torch)
    from coclr.eval.label_free import quality  # noqa: PLC0415

    found = {}
    for name in EMBEDDINGS:
        vectors = np.asarray(Embeddings(out / "embeddings" / name).videos)
        measured = quality(vectors)
        from_collapsed = any(exported.get(view, {}).get("collapsed") for view in SOURCES[name])
        found[name] = {**measured, "collapsed": measured["collapsed"] or from_collapsed,
                       "encoder_collapsed": from_collapsed}
    return found
