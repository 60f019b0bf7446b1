"""``coclr task RECORD``: run one job's task from its record, as a study or ``coclr learn`` runs it in a child
process (``OUT/logs/<job>.task.json``); by hand, to retry one job alone."""

from __future__ import annotations

import argparse

from coclr.cli._status import job_status


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "task", help="run one job of a study or of learn from its task record (what they run as a child process)",
        description="Run the task a study or `coclr learn` recorded for one of its jobs (OUT/logs/<job>.task.json): "
        "a training stage, a pipeline, a finetuning, a flow extraction. Each is resumable, so this continues the job "
        "where it stopped, on the threads it ran on where its result depends on them (the record's); its log is "
        "printed here, not in OUT/logs.")
    parser.add_argument("record", metavar="RECORD", help="the job's task record, OUT/logs/<job>.task.json")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from coclr.errors import ConfigError
    from coclr.jobs.tasks import read_task_file

    task, threads = read_task_file(args.record)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not task.shares_work:  # (each process did all of it, racing
        raise ConfigError(f"{args.record}: a {task.kind} task runs as one process, not under torchrun: run "  # the
                          "`coclr task` without torchrun")  # others on its folder)
    if threads is not None:  # its result depends on them: the job's, whatever the shell's OMP_NUM_THREADS
        import torch  # noqa: PLC0415 (heavy)

        torch.set_num_threads(threads)
    return job_status(task.run())
