"""``coclr pretrain``: one pretraining stage of any method (infonce, ubernce, coclr, cmc) on any view."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments, print_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pretrain", help="train an encoder with InfoNCE, UberNCE, CoCLR or CMC",
        description="Self-supervised pretraining of one stage. Runs on one process, or on many GPUs and "
        "machines under torchrun (torchrun --nproc_per_node=N -m coclr pretrain ...). The same command on the same "
        "run.out continues the run from its last checkpoint; other options are refused, naming each that differs. "
        "Where both views train (cmc, coclr with simultaneous=true), each view's encoder is also written as "
        "run.out/encoder_VIEW.pth at the end (the checkpoint itself loads as the first view's encoder).")
    add_config_arguments(parser)
    parser.add_argument("--restart", action="store_true",
                        help="move an earlier run in run.out aside (to <run.out>.replaced-<time>) and start over")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.config import load_config
    from coclr.train.config import PretrainConfig

    if args.list_options:
        print_options(PretrainConfig)
        return 0
    config = load_config(PretrainConfig, args.config, args.overrides)
    from coclr.distributed import is_main
    from coclr.train.run import pretrain

    trained = pretrain(config, restart=args.restart)
    if is_main():  # (under torchrun: once)
        print(f"last checkpoint: {trained.checkpoint}")
        if trained.finished:
            _write_views(trained.checkpoint, config.method.name)
        else:  # (it looked finished: exit 0, and no word)
            print(f"stopped before the end (run.max_steps={config.run.max_steps}): the same command without it, or "
                  "with a larger one, continues the run")
    return 0


def _write_views(checkpoint, method: str) -> None:
    """Where both views trained, each view's encoder as its own file beside the checkpoint (which loads as its
    first view's encoder)."""
    from coclr.train.checkpoint import load_checkpoint, trained_views, write_view_encoders

    views = trained_views(load_checkpoint(checkpoint))
    if len(views) > 1:
        files = {view: checkpoint.parent / f"encoder_{view}.pth" for view in views}
        write_view_encoders(checkpoint, files, {"method": method})
        print("encoders: " + ", ".join(f"{view} {path}" for view, path in files.items()))
