"""``coclr demo``: the whole paper on the built-in synthetic dataset, on a laptop CPU."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments, print_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="the paper's study on the built-in synthetic dataset, on CPU, in minutes",
        description="Generate the synthetic dataset, extract TV-L1 flow, train InfoNCE (RGB and flow), the "
        "UberNCE oracle and CoCLR (2 cycles), evaluate retrieval and the linear probe, and write "
        "results.json, results.md, the stage plot and the retrieval gallery into --out. Resumable.")
    parser.add_argument("--out", default="demo_out", help="output folder (default: demo_out)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, training and evaluation")
    add_config_arguments(parser, example="cycle_epochs=30")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.config import load_config
    from coclr.demo import DemoConfig, run_demo

    if args.list_options:
        print_options(DemoConfig)
        return 0
    config = load_config(DemoConfig, args.config, [*args.overrides, f"seed={args.seed}"])
    results = run_demo(config, args.out)
    print(open(f"{args.out}/results.md").read())
    print(f"wall time {results['wall_seconds'] / 60:.1f} min; results in {args.out}/")
    return 0
