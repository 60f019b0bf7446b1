"""``coclr flow``: compute optical flow for every video of a clip store and store it as a new view."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_option_flags, given_once, named_by_flags, options_from_flags
from coclr.cli._status import EXIT_DONE, job_status
from coclr.flow.options import FlowOptions


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
    add_option_flags(parser, FlowOptions)
    parser.add_argument("--list-options", action="store_true", help="print the TV-L1 parameters and exit")


def parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    """Parse STORE, the overrides and any options after them into ``args`` (options given before STORE stay)."""
    parser = argparse.ArgumentParser(prog="coclr flow", argument_default=argparse.SUPPRESS)
    add_options(parser)
    parser.add_argument("store", metavar="STORE", nargs="?", default=None)
    parser.add_argument("overrides", nargs="*", metavar="key=value", default=[])
    given_once(parser)  # (an option given before STORE and again after it, too: the later replaced the earlier)
    return parser.parse_intermixed_args(args.rest, namespace=args)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from coclr.config import describe, load_config, refuse_repeated
    from coclr.errors import ConfigError
    from coclr.flow.params import TVL1Params

    args = parse_rest(args)
    refuse_repeated(args.overrides or [])  # (read here, after the flags: main saw none of them)
    if args.list_options:
        for key, default, text in describe(TVL1Params):
            print(f"{key} = {default}\n    {text}")
        return 0
    if args.store is None:
        raise ConfigError("STORE: the clip store directory is required")
    params = load_config(TVL1Params, None, args.overrides) if args.overrides else None

    from coclr.store.flow_extract import extract_flow

    options = options_from_flags(FlowOptions, args)
    check_flow_view(options.view)
    with named_by_flags(FlowOptions):  # (a refusal of an option's value names its flag: --device, not device)
        summary = extract_flow(args.store, params=params, **dataclasses.asdict(options))
    print(summary, flush=True)
    failed = summary.totals[2] if summary.totals is not None else len(summary.failed)
    return job_status(failed) if summary.rank == 0 else EXIT_DONE  # under torchrun, rank 0 speaks for the job


def check_flow_view(view: str | None) -> None:
    """Refuse a view that training computes from RGB (``rgbdiff``: flow written under its name was never read, the
    encoder trained on RGB differences), and say of a view not named as flow that training will not take it as flow
    (a view's kind is read from its name: :func:`coclr.data.views.view_kind`)."""
    import sys  # noqa: PLC0415

    from coclr.data.views import DERIVED_VIEWS, is_flow_view  # noqa: PLC0415
    from coclr.errors import ConfigError  # noqa: PLC0415
    from coclr.store.clipstore import check_view_name  # noqa: PLC0415
    from coclr.store.flow_source import SOURCE_VIEW  # noqa: PLC0415

    if view is not None:  # (a name no store can hold: its one line, without a note above it)
        check_view_name(view)
    if view in DERIVED_VIEWS:
        raise ConfigError(f"--view {view}: training computes this view from {DERIVED_VIEWS[view]} on the fly and never "
                          "reads a stored one; give a flow view's name (e.g. flow_dis)")
    if view is not None and not is_flow_view(view) and view != SOURCE_VIEW:  # (the source: refused, not noted)
        print(f"coclr flow: note: --view {view}: training takes a view as flow by its name (flow, flow_...): "
              f"pretrain and pipeline refuse {view!r} as a view of no kind", file=sys.stderr)
