"""``coclr embed``: embed your own videos (files, folders, list files, globs) into a folder of NumPy arrays."""

from __future__ import annotations

import argparse
import dataclasses

from coclr.cli._options import add_option_flags, given_flags, named_by_flags, options_from_flags
from coclr.embed.options import EmbedJob
from coclr.embed.settings import EmbedSettings


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
                        "on flow embeds the flow stream alone, with its flow computed on the fly)")
    parser.add_argument("--out", required=True, help="output folder: new or empty (created), or one coclr embed "
                        "wrote (continued)")
    parser.add_argument("--flow-checkpoint",
                        help="flow encoder: embed two streams, with flow computed on the fly as the flow encoder's "
                        "store computed it (TV-L1, or DIS)")
    add_option_flags(parser, EmbedSettings, shown=lambda field: f"the checkpoint's, else {field.default}")
    add_option_flags(parser, EmbedJob)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    from coclr.cli._status import EXIT_DONE, job_status
    from coclr.config import validate
    from coclr.distributed import init_distributed, launched_world_size, pick_device, rank
    from coclr.embed.embedder import Embedder
    from coclr.embed.run import embed_videos
    from coclr.store.jobs import GROUP_TIMEOUT

    job = options_from_flags(EmbedJob, args)
    validate(job)
    device = pick_device(job.device, "--device")
    settings = given_flags(EmbedSettings, args)
    recorded = [field.name for field in dataclasses.fields(EmbedSettings) if field.name not in settings]
    with named_by_flags(EmbedSettings, recorded):  # a refused value given on the command line names its flag
        embedder = Embedder(args.checkpoint, device=device, flow_checkpoint=args.flow_checkpoint,
                            batch_size=job.batch_size, workers=job.workers, **settings)
    if launched_world_size() > 1:  # torchrun: the processes exchange only a few small messages; joined once the
        init_distributed(device, timeout=GROUP_TIMEOUT)  # encoders are read (a refusal is told to the others)
    summary = embed_videos(args.inputs, args.out, embedder, progress=job.progress, retry_failed=job.retry_failed,
                           flush_videos=job.flush_every)
    if rank() != 0:  # under torchrun, rank 0 speaks for the job
        return EXIT_DONE
    print(summary, flush=True)
    return job_status(len(summary.failed) + len(summary.failed_before))  # the folder lacks either, on every run
