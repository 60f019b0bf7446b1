"""``coclr embed``: embed your own videos (files, folders, list files, globs) into a folder of NumPy arrays."""

from __future__ import annotations

import argparse

from coclr.clips import PAPER_CLIPS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "embed", help="embed video files (no labels, index or store needed) into memory-mappable arrays",
        description="Embed every video named by INPUT (video files, folders searched recursively, list files of "
        "paths, glob patterns) with an encoder checkpoint (ours, the CoCLR authors', torchvision's s3d): one vector "
        "per window of the video and one per video (the mean of its windows, L2-normalised). Writes OUT/videos.npy, "
        "videos.jsonl, windows.npy, windows.jsonl, failed.jsonl and embed.json (the settings). The clip settings "
        "default to what the checkpoint recorded from its training, else the paper's. The same command continues "
        "after an interruption and adds only new or changed videos; other settings on the same folder are refused. "
        "Rows of files removed or changed since they were embedded are dropped. Under torchrun "
        "(torchrun --nproc_per_node=N -m coclr embed ...) the processes share the videos and write one folder.")
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="video files, folders, list files or glob patterns")
    parser.add_argument("--checkpoint", required=True, help="encoder checkpoint: the RGB stream (an encoder trained "
                        "on flow embeds the flow stream alone, with TV-L1 flow computed on the fly)")
    parser.add_argument("--out", required=True, help="output folder: new or empty (created), or one coclr embed "
                        "wrote (continued)")
    parser.add_argument("--flow-checkpoint",
                        help="flow encoder: embed two streams, with TV-L1 flow computed on the fly")
    parser.add_argument("--feature", choices=("backbone", "head"),
                        help="backbone: the pooled backbone feature (default, the paper's retrieval feature); head: "
                        "the projection head's 128-d output")
    parser.add_argument("--length", type=int, help="frames per window (default: the checkpoint's, else "
                        f"{PAPER_CLIPS['length']})")
    parser.add_argument("--stride", type=int, help="step between the frames of a window (default: the checkpoint's, "
                        f"else {PAPER_CLIPS['stride']})")
    parser.add_argument("--window-step", type=int, help="frames between window starts (default: half a window, as "
                        "coclr eval)")
    parser.add_argument("--fps", type=float, help="resample videos to this frame rate (default: the checkpoint's "
                        "store's, else every decoded frame)")
    parser.add_argument("--short-side", type=int, help="resize the short side to this many pixels before the crop "
                        "(default: the checkpoint's, else 128)")
    parser.add_argument("--size", type=int, help="side of the centre crop (default: the checkpoint's, else "
                        f"{PAPER_CLIPS['size']})")
    parser.add_argument("--mean", type=float, nargs=3, help="RGB normalisation mean (default: the checkpoint's, else "
                        "ImageNet's; Kinetics' for torchvision's s3d)")
    parser.add_argument("--std", type=float, nargs=3, help="RGB normalisation std (default as --mean)")
    parser.add_argument("--flow-bound", type=float, help="flow clipping bound in px (default: the flow checkpoint's, "
                        "else 20)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="fp32 (default) or bf16: the backbone under bfloat16 autocast, faster on CPUs with "
                        "AVX-512 BF16/AMX but not within cosine 0.999 of fp32 on every network (docs/embed.md)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default 16)")
    parser.add_argument("--workers", type=int, help="decoding processes (default: up to 8, leaving a core; 0: decode "
                        "in this process)")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--retry-failed", action="store_true", help="try again the videos that failed before")
    parser.add_argument("--flush-every", type=int, default=256, help="videos between writes of finished results to "
                        "OUT/chunks (a kill loses at most these; default 256)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    from coclr.cli._status import EXIT_DONE, job_status
    from coclr.distributed import init_distributed, launched_world_size, pick_device, rank
    from coclr.embed.embedder import Embedder
    from coclr.embed.run import embed_videos
    from coclr.errors import ConfigError
    from coclr.store.jobs import GROUP_TIMEOUT

    if args.flush_every < 1:
        raise ConfigError(f"--flush-every: must be at least 1, got {args.flush_every}")
    device = pick_device(args.device, "--device")
    if launched_world_size() > 1:  # torchrun: the processes exchange only a few small messages, so gloo everywhere
        init_distributed(device, backend="gloo", timeout=GROUP_TIMEOUT)
    settings = {"feature": args.feature, "length": args.length, "stride": args.stride, "window_step": args.window_step,
                "fps": args.fps, "short_side": args.short_side, "size": args.size, "mean": args.mean,
                "std": args.std, "flow_bound": args.flow_bound,
                "precision": None if args.precision == "fp32" else args.precision}
    embedder = Embedder(args.checkpoint, device=device, flow_checkpoint=args.flow_checkpoint,
                        batch_size=args.batch_size, workers=args.workers, **settings)
    summary = embed_videos(args.inputs, args.out, embedder, progress=not args.quiet, retry_failed=args.retry_failed,
                           flush_videos=args.flush_every)
    if rank() != 0:  # under torchrun, rank 0 speaks for the job
        return EXIT_DONE
    print(summary, flush=True)
    return job_status(len(summary.failed))
