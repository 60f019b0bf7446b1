"""``coclr data synth``: generate the built-in synthetic dataset (wired into ``coclr data``)."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments, print_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "synth",
        help="generate the built-in synthetic dataset (motion defines the class, appearance does not)",
        description="Generate the built-in synthetic dataset into a clip store, deterministically from a "
        "seed. Options of the generator are given as key=value (see --list-options).",
    )
    parser.add_argument("--out", required=True, help="output store directory")
    parser.add_argument("--seed", type=int, default=0, help="random seed (the dataset is a function of it)")
    parser.add_argument("--workers", type=int, help="worker processes (default: one per core; 0: none, work in this "
                        "process, as DataLoader's num_workers)")
    add_config_arguments(parser, example="train_scenes=8")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.config import load_config
    from coclr.synth import SynthConfig, generate_synthetic

    if args.list_options:
        print_options(SynthConfig)
        return 0
    config = load_config(SynthConfig, args.config, [*args.overrides, f"seed={args.seed}"])
    summary = generate_synthetic(args.out, config, workers=args.workers)
    print(summary)
    return 0
