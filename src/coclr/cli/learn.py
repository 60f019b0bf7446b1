"""``coclr learn``: learn encoders of your own videos, without labels, and embed and search them."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_option_flags, options_from_flags
from coclr.learn.options import LearnOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "learn", help="learn from your own videos, no labels: encoders, embeddings and a search page in one command",
        description="Learn RGB and optical-flow encoders of the videos named by VIDEOS (files, folders searched "
        "recursively, list files of paths, glob patterns), without labels, as the paper does (InfoNCE on each view, "
        "then two cycles of CoCLR co-training), sized to --budget on this machine from a short measurement; then "
        "embed every video with them. OUT gets encoder_rgb.pth and encoder_flow.pth (for coclr embed; "
        "and as .safetensors with their config), "
        "embeddings/{rgb,flow,two_stream} (for coclr search), report.html and learn.json (the plan, the time of "
        "each phase, the quality of each stage judged without labels). Each encoder is the last stage of its view "
        "that did not collapse; when every stage of a view collapsed, the run says so and exits with 3. The same "
        "command continues after an interruption; other videos (or ones changed since) or options on the same OUT "
        "are refused; a finished "
        "run returns at once. Under "
        "torchrun (torchrun --nproc_per_node=N -m coclr learn ...) the processes share the videos and every batch.")
    parser.add_argument("inputs", nargs="+", metavar="VIDEOS", help="video files, folders, list files or globs")
    parser.add_argument("--out", required=True, help="output folder: new or empty (created), or one coclr learn wrote "
                        "(continued)")
    add_option_flags(parser, LearnOptions)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.cli._status import EXIT_DONE, job_status
    from coclr.distributed import rank
    from coclr.learn import learn

    options = options_from_flags(LearnOptions, args)
    summary = learn(args.inputs, args.out, options)
    if rank() != 0:  # under torchrun, rank 0 speaks for the job
        return EXIT_DONE
    print(summary, flush=True)
    return job_status(len(summary.failed) + len(summary.collapsed_views))
