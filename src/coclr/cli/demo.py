"""``coclr demo``: the quick study on the built-in synthetic dataset, on a laptop CPU, in minutes."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments
from coclr.cli.study import add_study_arguments, run


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="the paper's study on the built-in synthetic dataset, on CPU, in minutes",
        description="The quick study (`coclr study` with its default config): generate the synthetic dataset, "
        "extract TV-L1 flow, train InfoNCE (RGB and flow), the UberNCE oracle and CoCLR (2 cycles), evaluate "
        "retrieval and the linear probe, and write results.md, results.json, the stage plot and the retrieval "
        "gallery into --out. Resumable.")
    add_study_arguments(parser, "demo_out")
    add_config_arguments(parser, example="schedule.cycle_epochs=30")
    parser.set_defaults(func=run)
