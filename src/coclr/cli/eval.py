"""``coclr eval retrieval|linear|finetune``: evaluate a pretrained encoder on an evaluation clip store.

The evaluation store is independent of the one the encoder was pretrained on (pretrain on one dataset,
evaluate on another). Every run writes a JSON record of the checkpoint (path and sha256), the store, the
view(s), the split sizes, the options and the numbers; ``coclr report`` turns such files into tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from coclr.cli._options import add_clip_arguments, add_option_flags, config_from_flags
from coclr.eval.options import FinetuneConfig, LinearProbeConfig


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="encoder checkpoint (ours or the authors')")
    parser.add_argument("--store", required=True, help="evaluation clip store (with train and test splits)")
    parser.add_argument("--view", help="store view the encoder reads: rgb, flow, ... (default: the view it was "
                        "trained on, else rgb; a view of another kind is refused)")
    parser.add_argument("--checkpoint2", help="second encoder for two-stream evaluation (e.g. the flow network)")
    parser.add_argument("--view2", help="view of --checkpoint2 (default: the view it was trained on, else flow)")
    parser.add_argument("--out", help="JSON file to write the result record to, which coclr report reads (default: "
                        "none; the main figures are printed either way); a new file, or a result file: rewritten")
    parser.add_argument("--also-views", nargs="+", default=[], metavar="VIEW",
                        help="evaluate only the videos that also have these views (so that evaluations run apart, "
                        "e.g. an RGB and a flow encoder, compare the same videos)")
    parser.add_argument("--train-split", default="train", help="split used for training / as gallery (default train)")
    parser.add_argument("--test-split", default="test", help="split used for testing / as queries (default test)")
    add_clip_arguments(parser)
    parser.add_argument("--name", help="method name shown by 'coclr report' (default: from the checkpoint)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="evaluate an encoder: retrieval R@k, linear probe, finetune (ten-crop test)",
        description="Evaluate a pretrained encoder on a clip store with the paper's protocols: nearest-"
        "neighbour retrieval (test videos query train videos, R@1/5/10/20), a linear probe on frozen features "
        "(hyper-parameters chosen on held-out train videos), or end-to-end finetuning (ten-crop test). "
        "--checkpoint2/--view2 evaluate two streams and average their similarities or probabilities.")
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")

    retrieval = tasks.add_parser(
        "retrieval", help="nearest-neighbour retrieval, R@k",
        description="Each test video queries the train videos by the cosine similarity of its features (each the "
        "mean of its windows' pooled backbone features, each L2-normalised first, as the authors' retrieval; then "
        "centred by the train videos' mean); R@k is the share of "
        "queries with a video of their class among their k nearest, ties counted in expectation.")
    _add_common(retrieval)
    retrieval.add_argument("--ks", type=int, nargs="+", default=[1, 5, 10, 20],
                           help="k values, at least 1 (default 1 5 10 20; a k above the number of train videos is "
                           "computed over all of them, with a warning)")
    retrieval.add_argument("--cache-dir", help="feature cache folder (keyed by checkpoint content and data options)")

    linear = tasks.add_parser(
        "linear", help="linear probe on frozen features",
        description="A linear classifier (L2 normalisation, batch-norm, then a linear layer: the authors' probe) "
        "trained with Adam on the frozen features of the train videos, on one CPU thread (its result the same on "
        "any number); learning rate, weight decay and epochs are chosen on held-out train videos, then the probe is "
        "retrained on every train video and tested once. Writes the test probabilities beside --out.")
    _add_common(linear)
    linear.add_argument("--cache-dir", help="feature cache folder (keyed by checkpoint content and data options)")
    add_option_flags(linear, LinearProbeConfig)

    finetune = tasks.add_parser(
        "finetune", help="end-to-end finetuning, centre-crop and ten-crop test",
        description="The encoder and a linear classifier (dropout before it) trained end to end on the train "
        "videos, the backbone at --backbone-lr-scale times the classifier's learning rate; the model after the "
        "last epoch is tested with centre crops and with the ten-crop test. Resumable in --work-dir.")
    _add_common(finetune)
    finetune.add_argument("--work-dir", help="folder for the resumable state and probabilities (default: --out "
                          "without its suffix, or OUT.work where it has none; else ./finetune)")
    add_option_flags(finetune, FinetuneConfig)
    parser.set_defaults(func=run)


def task_options(args: argparse.Namespace):
    """The options of the task ``args.task`` asks for (:class:`coclr.eval.evaluate.TaskOptions`)."""

    from coclr.eval.evaluate import TaskOptions

    if args.task == "retrieval":
        return TaskOptions(ks=args.ks, cache_dir=args.cache_dir)
    if args.task == "linear":
        probe = config_from_flags(LinearProbeConfig, args)
        return TaskOptions(probe=probe, cache_dir=args.cache_dir,
                           probabilities=Path(args.out).with_suffix(".probabilities.npz") if args.out else None)
    config = config_from_flags(FinetuneConfig, args)
    work_dir = Path(args.work_dir) if args.work_dir else (
        work_dir_of(Path(args.out)) if args.out else Path("finetune"))
    return TaskOptions(finetune=config, work_dir=work_dir)


def work_dir_of(out: Path) -> Path:
    """The finetuning's default work folder beside its result ``out``: ``out`` without its suffix, or ``out.work``
    where it has none (the folder was the result's own path: the finetuning trained, then could not write it)."""
    return out.with_suffix("") if out.suffix else out.with_name(out.name + ".work")


def check_outputs(args: argparse.Namespace, options) -> None:
    """Refuse, before any work, outputs that would overwrite what ``coclr eval`` did not write or land in another
    command's folder (:mod:`coclr.runfolder`): the result file, the linear probe's probabilities beside it, the
    feature cache (the finetuning folder is checked by the finetuning itself, before it trains)."""
    from coclr.eval.features import check_cache_dir
    from coclr.eval.finetune import is_probabilities_file
    from coclr.eval.report import is_result_file
    from coclr.runfolder import check_output_file

    if args.out:
        check_output_file(args.out, "eval", is_result_file, "a coclr eval result")
    if options.probabilities is not None:
        check_output_file(options.probabilities, "eval", is_probabilities_file, "a probabilities file")
    if options.cache_dir is not None:
        check_cache_dir(options.cache_dir)


TOP_K = 5
"""The k of the classifiers' top-k accuracy beside their top-1 (the results' ``top5``)."""


def run(args: argparse.Namespace) -> int:

    from coclr.atomic import atomic_write_json, remove_stale_partials_of
    from coclr.cli._status import job_status
    from coclr.distributed import pick_device
    from coclr.errors import ConfigError, DataError
    from coclr.eval.evaluate import check_evaluable, evaluate_checkpoint
    from coclr.eval.features import (
        ClipConfig,
        Stream,
        check_inputs,
        label_warnings,
        split_entries,
        trained_clips,
        trained_view,
        unlike_training,
    )
    from coclr.eval.report import degenerate
    from coclr.models.loading import require_checkpoint_file
    from coclr.store.clipstore import DamagedEntryError, open_store
    from coclr.text import shown as shown_text

    options = task_options(args)
    check_outputs(args, options)
    checkpoints = [Path(args.checkpoint)] + ([Path(args.checkpoint2)] if args.checkpoint2 else [])
    for path in checkpoints:
        require_checkpoint_file(path)
    streams = [Stream(checkpoints[0], trained_view(checkpoints[0], args.view))]
    if args.checkpoint2:
        streams.append(Stream(checkpoints[1], trained_view(checkpoints[1], args.view2, "--view2", default="flow")))
    clips, sources = trained_clips(checkpoints, length=args.length, stride=args.stride, size=args.size)
    clip_config = config_from_flags(ClipConfig, args, **clips)
    device = str(pick_device(args.device, "--device"))
    store = open_store(args.store)
    views = [*(s.view for s in streams), *args.also_views]
    left_out = check_inputs(store, streams, [args.train_split, args.test_split], args.also_views)
    check_evaluable(args.task, store, streams, options, args.train_split, args.test_split, args.also_views)
    if args.task == "retrieval":
        if min(args.ks) < 1:
            raise ConfigError(f"--ks {' '.join(map(str, args.ks))}: each k must be at least 1")
        gallery = len(split_entries(store, args.train_split, views))
        beyond = [k for k in args.ks if k > gallery]
        if beyond:
            print(f"coclr eval: warning: k = {', '.join(map(str, beyond))} exceed{'s' if len(beyond) == 1 else ''} "
                  f"the {gallery} {args.train_split!r} "
                  f"videos retrieved: R@k is computed over all {gallery} there (a hit whenever the class is in the "
                  "gallery)", file=sys.stderr)
    for line in label_warnings(split_entries(store, args.train_split, views),
                               split_entries(store, args.test_split, views), args.train_split, args.test_split):
        print(f"coclr eval: warning: {line}", file=sys.stderr)
    if args.task in ("linear", "finetune") and len(store.index.classes) <= TOP_K:  # (100%, as if it were a result)
        print(f"coclr eval: note: top-{TOP_K} is 100% by construction with {len(store.index.classes)} classes (at "
              f"most {TOP_K}): only top-1 measures the classifier", file=sys.stderr)
    shown = ", ".join(f"{key} {value} ({sources[key]})" for key, value in clips.items())
    print(f"coclr eval: clips of {shown}; views {', '.join(s.view for s in streams)}", file=sys.stderr)
    for stream in streams:
        for line in unlike_training(store, stream.checkpoint, stream.view):
            print(f"coclr eval: warning: {line}", file=sys.stderr)
    for split, videos in left_out.items():
        if videos:
            from coclr.data.datasets import left_out_message

            print(f"coclr eval: {left_out_message(store, split, views, videos)}", file=sys.stderr)
    while True:  # a damaged entry found as its frames are read: that video's failure, not the job's
        try:
            record = evaluate_checkpoint(args.task, store, streams, clip_config, options, name=args.name,
                                         device=device, train_split=args.train_split, test_split=args.test_split,
                                         with_views=args.also_views, progress=not args.quiet)
            break
        except DamagedEntryError as error:  # (listed by the store as failed as it was found)
            before = sum(map(len, left_out.values()))
            store = open_store(args.store)
            left_out = check_inputs(store, streams, [args.train_split, args.test_split], args.also_views)
            if sum(map(len, left_out.values())) <= before:  # (not listed: the store may not be written)
                raise DataError(f"{error}; it could not be listed as failed: make the store writable, or rebuild "
                                "its entry (coclr data store, or coclr flow for a flow view)") from None
            check_evaluable(args.task, store, streams, options, args.train_split, args.test_split, args.also_views)
            print(f"coclr eval: {shown_text(error)}; listed as failed and left out: the evaluation starts again "
                  "without it (the next coclr data store, or coclr flow for a flow view, rebuilds its entry)",
                  file=sys.stderr)
    left = sum(len(videos) for videos in left_out.values())
    if args.out:
        remove_stale_partials_of(args.out)  # (a killed run's, beside the user's files)
        atomic_write_json(args.out, record)
        print(f"wrote {args.out}")
    for warning in record.get("warnings", []):
        print(f"coclr eval: warning: {warning}", file=sys.stderr)
    summary = {key: value for key, value in record["results"].items() if key not in ("grid", "train_losses")}
    if "feature_health" in record:  # the probe and retrieval judge the features; finetuning retrains them
        summary["collapsed"] = degenerate(record)
    print(json.dumps({"task": args.task, "views": [s.view for s in streams], "clips": clips, **summary}, indent=1))
    return job_status(left)  # (videos left out: the figures are of the others)
