"""``coclr pipeline``: the paper's whole algorithm (InfoNCE initialisation, then CoCLR cycles) in one run."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments, print_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pipeline", help="InfoNCE on both views, then cycles of co-training (resumable)",
        description="Run the CoCLR algorithm end to end in one run folder (run.out). Running the same "
        "command again continues where it stopped; other options are refused, naming each that differs (those "
        "that change only where it runs, what it shows or where it stops may change: the device, progress, logging, "
        "how often it saves and checks, run.max_steps, the batch per process, workers, caches, and --until). "
        "Works under torchrun too.")
    add_config_arguments(parser)
    parser.add_argument("--restart", action="store_true",
                        help="move an earlier run in run.out aside (to <run.out>.replaced-<time>) and start over")
    parser.add_argument("--until", metavar="STAGE", help="stop after this stage (e.g. cycle1_flow); running "
                        "again without it continues with the rest")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.config import load_config
    from coclr.train.config import PER_STAGE, PipelineConfig

    if args.list_options:  # (not the options each stage sets: given, they are refused)
        print_options(PipelineConfig, set_elsewhere=PER_STAGE)
        return 0
    config = load_config(PipelineConfig, args.config, args.overrides)
    from coclr.train.pipeline import run_pipeline

    run_dir = run_pipeline(config, until=args.until, restart=args.restart)
    from coclr.distributed import is_main

    if is_main():  # (under torchrun: once)
        print(f"pipeline folder: {run_dir} (stages in {run_dir / 'manifest.json'})")
        from coclr.train.pipeline import read_manifest

        pending = [stage["name"] for stage in read_manifest(run_dir).get("stages", []) if stage["status"] != "done"]
        if pending:  # (--until, or run.max_steps stopping a stage): said, not left to be found in the manifest
            print(f"stopped before the end: {', '.join(pending)} not finished; the same command without --until or "
                  "run.max_steps continues")
    return 0
