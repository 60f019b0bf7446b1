"""``coclr learn``: learn encoders of your own videos, without labels, and embed and search them."""

from __future__ import annotations

import argparse


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
        "command continues after an interruption; other videos or options on the same OUT are refused; a finished "
        "run returns at once. Under "
        "torchrun (torchrun --nproc_per_node=N -m coclr learn ...) the processes share the videos and every batch.")
    parser.add_argument("inputs", nargs="+", metavar="VIDEOS", help="video files, folders, list files or globs")
    parser.add_argument("--out", required=True, help="output folder: new or empty (created), or one coclr learn wrote "
                        "(continued)")
    parser.add_argument("--budget", default="15m", help="wall-clock time for the whole run, e.g. 5m, 90m, 2h "
                        "(default 15m): the network, clip size and epochs are chosen to fit it")
    parser.add_argument("--labels", help="a --format csv manifest (path,label[,split[,group]], UTF-8; paths "
                        "relative to its folder, or absolute) of some of the videos: never used to train, only to "
                        "score the embeddings (kNN accuracy, R@k)")
    parser.add_argument("--init", metavar="CHECKPOINT", help="start the RGB encoder from this checkpoint instead of "
                        "random weights (any file coclr embed takes: the authors' released ones, torchvision's s3d "
                        "weights, ours); its network and clip size are kept, the budget sizes the schedule")
    parser.add_argument("--flow-init", metavar="CHECKPOINT", help="start the flow encoder from this checkpoint "
                        "(default: from scratch); its flow bound is kept")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initialisation, data order and augmentation")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--workers", type=int, help="processes decoding videos and computing flow (default: one per "
                        "core)")
    parser.add_argument("--restart", action="store_true", help="move an earlier run in OUT aside and start over")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.cli._status import EXIT_DONE, job_status
    from coclr.distributed import rank
    from coclr.learn import LearnOptions, learn
    from coclr.learn.budget import parse_budget

    options = LearnOptions(budget=parse_budget(args.budget), seed=args.seed, labels=args.labels, device=args.device,
                           workers=args.workers, restart=args.restart, progress=not args.quiet,
                           init=args.init, flow_init=args.flow_init)
    summary = learn(args.inputs, args.out, options)
    if rank() != 0:  # under torchrun, rank 0 speaks for the job
        return EXIT_DONE
    print(summary, flush=True)
    return job_status(len(summary.failed) + len(summary.collapsed_views))
