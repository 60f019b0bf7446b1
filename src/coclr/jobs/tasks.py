"""The work of a job, as configuration objects: a training stage, a pipeline (to one of its stages), the
finetuning of one stream, a view's optical flow, and the timing of training beside another process.

A study and ``coclr learn`` build their jobs from these, typed and validated as they are built, never as command
lines. The scheduler starts each task in a child process that reads it back from its record
(:meth:`Task.record`, :func:`read_task`; ``coclr task RECORD``); :func:`check_records` makes sure, before any work,
that every task reads back as itself.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from coclr.atomic import atomic_write_json
from coclr.config import from_dict, to_dict, whole_number
from coclr.errors import CoclrError, ConfigError
from coclr.eval.options import ClipConfig, FinetuneConfig
from coclr.flow.options import FlowOptions
from coclr.train.config import PipelineConfig, PretrainConfig

EPOCHS_DONE = "epochs_done"
"""The key of the line (``{"epochs_done": N}``) a task whose training keeps no ``log.jsonl`` (finetuning) prints
each time ``N`` of its epochs are done and kept: what the scheduler's progress counts (the last ``N`` in the job's
log, which every run of it appends to)."""


def tell_epochs_done(done: int) -> None:
    """Print the line of :data:`EPOCHS_DONE` for ``done`` epochs."""
    print(json.dumps({EPOCHS_DONE: done}), flush=True)


TASKS: dict[str, type[Task]] = {}
"""Every kind of task, by the name its record gives (``"task"``)."""


class Task:
    """What a job runs: a frozen dataclass of typed options whose :meth:`run` does the work in this process."""

    kind: ClassVar[str] = ""
    shares_work: ClassVar[bool] = False
    """Whether the processes torchrun starts share the task's work (a training run); the others run as one process."""
    tells_epochs: ClassVar[bool] = False
    """Whether the task prints the line of :data:`EPOCHS_DONE` as its epochs are kept (what the scheduler's progress
    reads from its log; a training run's epochs are in its run folder's ``log.jsonl``)."""
    thread_bound: ClassVar[bool] = True
    """Whether the task's result depends on its thread count on a CPU (training and finetuning: oneDNN orders a
    convolution's sums by it, and training grows the last bits): such a task runs on a fixed count
    (:func:`coclr.jobs.scheduler.run_jobs`'s ``threads``), the others (flow) on their share of the cores."""

    def __init_subclass__(cls, kind: str = "", **rest: Any) -> None:
        super().__init_subclass__(**rest)
        cls.kind = kind
        TASKS[kind] = cls

    def run(self) -> int:
        """Do the work; returns how many inputs failed (a per-input job's; 0 for the others)."""
        raise NotImplementedError

    def describe(self) -> str:
        """A few words on what the task does (a plan's description)."""
        raise NotImplementedError

    def writes(self) -> tuple[Path, ...]:
        """The folders the task claims for writing whose names are known only from its inputs, read when it is
        about to start (the jobs it needs are done): the scheduler runs two tasks that claim the same folder one
        after the other, not at once (the second finds the first's work done). None by default."""
        return ()

    def record(self) -> dict[str, Any]:
        """The task as JSON values (``{"task": KIND, OPTION: VALUE, ...}``): what the child process reads back."""
        return {"task": self.kind, **{field.name: _plain(getattr(self, field.name))
                                      for field in dataclasses.fields(self)}}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _typed(tp: Any, value: Any, key: str) -> Any:
    """``value`` of a record as the field's type ``tp`` (configurations rebuilt and validated); a value of another
    type is a :class:`ConfigError` naming the field."""
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
    if optional:
        tp = next(arg for arg in typing.get_args(tp) if arg is not type(None))
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: needs a value, got null")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of options, got {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{key}: expected a list of names, got {value!r}")
        return tuple(value)
    expected = {Path: (str,), str: (str,), int: (int,), float: (int, float)}.get(tp)
    if expected is not None and (isinstance(value, bool) or not isinstance(value, expected)):
        raise ConfigError(f"{key}: expected {'a path' if tp is Path else f'a {tp.__name__}'}, got {value!r}")
    return Path(value) if tp is Path else value


def read_task(record: Mapping[str, Any]) -> Task:
    """The task a :meth:`Task.record` describes; a :class:`ConfigError` names what it cannot take."""
    kind = record.get("task")
    if not isinstance(kind, str) or kind not in TASKS:
        raise ConfigError(f"task: {kind!r} is not a kind of task ({', '.join(sorted(TASKS))})")
    cls = TASKS[kind]
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted(set(record) - set(fields) - {"task"})
    if unknown:
        raise ConfigError(f"task {kind}: unknown option(s) {', '.join(unknown)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        if name in record:
            values[name] = _typed(hints[name], record[name], name)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"task {kind}: {name} is missing")
    return cls(**values)


THREADS_KEY = "threads"
"""The key of a task file that holds the threads its job ran on where its result depends on them
(:attr:`Task.thread_bound`; :func:`coclr.jobs.scheduler.start_task`): a retry by hand runs on them too."""


def read_task_file(path: str | Path) -> tuple[Task, int | None]:
    """The task recorded in the JSON file ``path`` (what the scheduler writes for a job's child), and the threads
    it runs on (None: any)."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such task record") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not a task record ({error})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: not a task record (a JSON object is needed)")
    threads = record.pop(THREADS_KEY, None)
    if threads is not None and (not whole_number(threads) or threads < 1):
        raise ConfigError(f"{path}: {THREADS_KEY} must be a whole number of at least 1, got {threads!r}")
    return read_task(record), threads


def check_records(named: Sequence[tuple[str, Task]]) -> dict[str, dict[str, Any]]:
    """Every ``(name, task)``'s record, each checked to read back as the same task (so that no child process
    refuses its own, hours into a run); a :class:`CoclrError` names the first that does not."""
    records = {}
    for name, task in named:
        try:
            record = json.loads(json.dumps(task.record()))
            back = read_task(record)
        except (CoclrError, TypeError, ValueError) as error:
            raise CoclrError(f"job {name}: its task cannot be recorded for its process: {error}") from None
        if back != task:
            raise CoclrError(f"job {name}: its task reads back otherwise from its record ({task.kind})")
        records[name] = record
    return records


@dataclasses.dataclass(frozen=True)
class Pretrain(Task, kind="pretrain"):
    """One training stage (:func:`coclr.train.run.pretrain`): resumable, and it refuses a changed configuration on
    its own."""

    shares_work = True

    config: PretrainConfig

    def run(self) -> int:
        from coclr.train.run import pretrain  # noqa: PLC0415 (heavy: torch)

        trained = pretrain(self.config)
        print(f"last checkpoint: {trained.checkpoint}", flush=True)
        return 0

    def describe(self) -> str:
        return f"pretrain {self.config.method.name} ({self.config.data.view})"


@dataclasses.dataclass(frozen=True)
class Pipeline(Task, kind="pipeline"):
    """The CoCLR pipeline (:func:`coclr.train.pipeline.run_pipeline`), to stage ``until`` (None: every stage)."""

    shares_work = True

    config: PipelineConfig
    until: str | None = None

    def run(self) -> int:
        from coclr.train.pipeline import run_pipeline  # noqa: PLC0415 (heavy: torch)

        folder = run_pipeline(self.config, until=self.until)
        print(f"pipeline folder: {folder}", flush=True)
        return 0

    def describe(self) -> str:
        return f"pipeline{f' until {self.until}' if self.until else ''}"


@dataclasses.dataclass(frozen=True)
class Finetune(Task, kind="finetune"):
    """End-to-end finetuning of the encoder ``checkpoint`` on ``view`` of ``store``, and its test
    (:func:`coclr.eval.evaluate.evaluate_checkpoint`), resumable in ``work_dir``; on the videos that also have
    ``also_views``."""

    checkpoint: Path
    view: str
    store: Path
    work_dir: Path
    clips: ClipConfig
    options: FinetuneConfig
    also_views: tuple[str, ...] = ()
    tells_epochs: ClassVar[bool] = True

    def run(self) -> int:
        from coclr.distributed import pick_device  # noqa: PLC0415 (heavy: torch)
        from coclr.eval.evaluate import TaskOptions, evaluate_checkpoint  # noqa: PLC0415
        from coclr.eval.features import Stream, check_inputs, trained_view  # noqa: PLC0415
        from coclr.store.clipstore import open_store  # noqa: PLC0415

        stream = Stream(self.checkpoint, trained_view(self.checkpoint, self.view))
        store = open_store(self.store)
        check_inputs(store, [stream], ["train", "test"], self.also_views)
        record = evaluate_checkpoint("finetune", store, [stream], self.clips,
                                     TaskOptions(finetune=self.options, work_dir=self.work_dir),
                                     device=str(pick_device(None)), with_views=list(self.also_views), progress=False,
                                     on_epoch=tell_epochs_done)
        results = {key: value for key, value in record["results"].items() if key not in ("grid", "train_losses")}
        print(json.dumps({"task": "finetune", "view": stream.view, **results}), flush=True)
        return 0

    def describe(self) -> str:
        return f"finetune ({self.view})"

    def writes(self) -> tuple[Path, ...]:
        """The stream's finetuning folder, named by the checkpoint's bytes: two rows whose encoder files have the
        same bytes share it."""
        from coclr.eval.features import Stream, trained_view  # noqa: PLC0415 (heavy: torch)
        from coclr.eval.finetune import stream_folders  # noqa: PLC0415

        return tuple(stream_folders([Stream(self.checkpoint, trained_view(self.checkpoint, self.view))],
                                    self.work_dir, self.also_views))


@dataclasses.dataclass(frozen=True)
class Flow(Task, kind="flow"):
    """A view of optical flow of ``store``'s videos (:func:`coclr.store.flow_extract.extract_flow`): resumable, a
    video that fails is that video's failure."""

    store: Path
    options: FlowOptions
    thread_bound: ClassVar[bool] = False  # (the flow's values are the same on any thread count)

    def run(self) -> int:
        from coclr.store.flow_extract import extract_flow  # noqa: PLC0415 (heavy: torch)

        summary = extract_flow(self.store, **dataclasses.asdict(self.options))
        print(summary, flush=True)
        return summary.totals[2] if summary.totals is not None else len(summary.failed)

    def describe(self) -> str:
        return f"flow ({self.options.split or 'every'} split)"


@dataclasses.dataclass(frozen=True)
class TrainingTiming(Task, kind="timing"):
    """The seconds of a training step of S3D of ``width`` (clips of ``length`` frames of ``size`` px, ``batch``
    clips) and from ``launched`` (the parent's ``time.time()``) until the process could train
    (:func:`coclr.train.timing.time_one_thread`): written to ``result`` as JSON."""

    width: float
    size: int
    length: int
    batch: int
    steps: int
    launched: float
    result: Path

    def run(self) -> int:
        from coclr.train.timing import time_one_thread  # noqa: PLC0415 (heavy: torch)

        atomic_write_json(self.result, time_one_thread(self.width, self.size, self.length, self.batch, self.steps,
                                                       self.launched))
        return 0

    def describe(self) -> str:
        return f"timing of S3D width {self.width}, {self.length}x{self.size}"
