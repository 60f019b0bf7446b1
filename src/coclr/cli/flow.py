"""``coclr flow``: compute optical flow for every video of a clip store and store it as a new view."""

from __future__ import annotations

import argparse

from coclr.cli._status import EXIT_DONE, job_status
from coclr.flow.backends import ALIASES, BACKENDS, backends_help


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "flow",
        help="extract optical flow (TV-L1 as in the paper, or the much faster DIS) into a clip store",
        description="Compute optical flow between consecutive RGB frames of every video in STORE and write it "
        "as a view of the store, in the paper's format (clipped to +-20 px or --bound, uint8, JPEG). Resumable: "
        "videos already extracted are skipped, so a killed run continues where it stopped. TV-L1 parameters are "
        "given as key=value (see --list-options); they default to OpenCV's. Under torchrun (torchrun "
        "--nproc_per_node=8 [--nnodes ...] -m coclr flow STORE ...) every process takes its share of the videos, "
        "on its own GPU; the store must be on a file system all machines share.",
    )
    add_options(parser)
    # Everything from STORE on is parsed in run(), intermixed, so options may follow the key=value overrides
    # (argparse alone cannot take positionals after options that follow the first positional).
    parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="STORE [key=value ...] [options]",
                        help="clip store directory (with an 'rgb' view), then TV-L1 parameter overrides, e.g. "
                        "warps=3")
    parser.set_defaults(func=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``coclr flow`` (shared by the subcommand parser and the parser of what follows STORE)."""
    parser.add_argument("--backend", default="auto", choices=[*BACKENDS, *ALIASES], help=backends_help())
    parser.add_argument("--view", help="view name to write (default: 'flow' for TV-L1, 'flow_dis' for DIS)")
    parser.add_argument("--workers", type=int,
                        help="worker processes for the CPU backends, JPEG processes for tvl1-torch (default: one per "
                        "core; 0: none, work in this process, as DataLoader's num_workers)")
    parser.add_argument("--split", help="only the videos of this split: train, val or test (default: every video "
                        "of the store)")
    parser.add_argument("--device", help="torch device for tvl1-torch, e.g. cpu, cuda, cuda:1 (default: cuda "
                        "when available)")
    parser.add_argument("--bound", type=float,
                        help="clip flow to +-BOUND px before storing it as uint8 (one step is 2*BOUND/255 px). The "
                        "default, 20, is the I3D convention for frames of 128 px or more; scale it with the frame "
                        "size (5 at 32 px). A resumed extraction must use the view's bound")
    parser.add_argument("--mode", choices=("exact", "fast"),
                        help="tvl1-torch: exact tests for stopping after every inner iteration as OpenCV does (the "
                        "default); fast tests every --stop-every iterations, which the GPU runs as one fused pass "
                        "(Middlebury error within 2%% of OpenCV's, stored flow within 0.5 units of exact). A view "
                        "keeps the mode it was started with")
    parser.add_argument("--stop-every", type=int, help="fast mode: inner iterations between stop tests (default 5)")
    parser.add_argument("--batch-pairs", type=int,
                        help="tvl1-torch: frame pairs solved together, taken across videos (default 64 on the CPU, "
                        "256 on a GPU)")
    parser.add_argument("--kernels", choices=("auto", "torch", "triton", "c"),
                        help="tvl1-torch: what runs the iterations; auto (default): the fused Triton kernels on "
                        "CUDA when Triton imports, the fused C loops on the CPU when a C compiler builds them, "
                        "else PyTorch operations")
    parser.add_argument("--jpeg", choices=("opencv", "nvjpeg"),
                        help="tvl1-torch: encode flow frames with OpenCV in worker processes (default) or with "
                        "nvJPEG on the GPU (needs torchvision; its JPEG bytes differ slightly from OpenCV's)")
    parser.add_argument("--list-options", action="store_true", help="print the TV-L1 parameters and exit")


def parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    """Parse STORE, the overrides and any options after them into ``args`` (options given before STORE stay)."""
    parser = argparse.ArgumentParser(prog="coclr flow", argument_default=argparse.SUPPRESS)
    add_options(parser)
    parser.add_argument("store", metavar="STORE", nargs="?", default=None)
    parser.add_argument("overrides", nargs="*", metavar="key=value", default=[])
    return parser.parse_intermixed_args(args.rest, namespace=args)


def run(args: argparse.Namespace) -> int:
    from coclr.config import describe, load_config
    from coclr.errors import ConfigError
    from coclr.flow.params import TVL1Params

    args = parse_rest(args)
    if args.list_options:
        for key, default, text in describe(TVL1Params):
            print(f"{key} = {default}\n    {text}")
        return 0
    if args.store is None:
        raise ConfigError("STORE: the clip store directory is required")
    params = load_config(TVL1Params, None, args.overrides) if args.overrides else None

    import torch

    from coclr.distributed import init_distributed, launched_world_size
    from coclr.store.flow_extract import extract_flow, resolve_backend
    from coclr.store.jobs import GROUP_TIMEOUT

    options = {key: getattr(args, key) for key in ("bound", "mode", "stop_every", "batch_pairs", "kernels", "jpeg")
               if getattr(args, key, None) is not None}
    _, device = resolve_backend(args.backend, args.device, options.get("mode", "exact"), options.get("kernels", "auto"))
    if launched_world_size() > 1:  # torchrun: the processes exchange only a few small messages, so gloo everywhere
        init_distributed(torch.device(device or "cpu"), backend="gloo", timeout=GROUP_TIMEOUT)
    summary = extract_flow(args.store, backend=args.backend, view=args.view, params=params,
                           workers=args.workers, device=args.device, split=args.split, **options)
    print(summary, flush=True)
    failed = summary.totals[2] if summary.totals is not None else len(summary.failed)
    return job_status(failed) if summary.rank == 0 else EXIT_DONE  # under torchrun, rank 0 speaks for the job
