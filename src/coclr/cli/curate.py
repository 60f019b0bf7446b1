"""``coclr curate``: near-duplicates, outliers and a map of every video of a ``coclr embed`` folder."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_option_flags, options_from_flags
from coclr.cli._status import job_status
from coclr.curate.run import CurateOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "curate", help="near-duplicates, outliers and a map of every video of an embedding folder, on one page",
        description="From EMBED_DIR (a coclr embed folder, e.g. coclr learn's embeddings/two_stream), write into OUT: "
        "duplicates.csv (groups of near-duplicate videos, and the stretches two videos share where only part of one "
        "repeats, with their start and end seconds), outliers.csv (every video ranked by how unlike the rest it is: "
        "one minus the mean similarity of its nearest others), index.html (a map of every video: hover for an "
        "animated thumbnail, click for its nearest, the duplicate groups and outliers listed beside it; offline) "
        "and curate.json. The near-duplicate threshold is calibrated on altered copies of some of the videos "
        "(embedded as the folder was) unless --threshold is given; it is printed and recorded. The same command on "
        "the same OUT runs again from what it kept; other options are refused.")
    parser.add_argument("embeddings", metavar="EMBED_DIR", help="a coclr embed output folder")
    parser.add_argument("--out", required=True, help="output folder: new or empty (created), or one the same "
                        "coclr curate wrote")
    add_option_flags(parser, CurateOptions)
    parser.add_argument("--restart", action="store_true", help="move an earlier run in OUT aside and start over")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.curate.run import curate

    summary = curate(args.embeddings, args.out, options_from_flags(CurateOptions, args), restart=args.restart,
                     show=not args.quiet)
    print(summary, flush=True)
    return job_status(summary.unfingerprinted)  # 3 when videos could not be read: listed, nobody's duplicate
