"""``coclr report``: the paper's Table 1, Figure 4 and Figure 5 from evaluation results or a pipeline run."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from coclr.cli._options import add_clip_arguments, config_from_flags
from coclr.cli._status import job_status

if TYPE_CHECKING:
    from coclr.eval.features import ClipConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="table, R@1-per-stage plot and retrieval gallery from results or a pipeline run",
        description="Write to --out: table.md / table.json (Method | Input | Labels | Linear probe | Finetune | "
        "R@1, '-' where not evaluated) from 'coclr eval' result files; with --run, retrieval is evaluated "
        "after every finished stage of a 'coclr pipeline' run on --store and stage_recall.png shows R@1 of the "
        "RGB and flow networks (dotted where frozen); gallery.html shows test queries with their top-3 "
        "training neighbours as animated thumbnails (self-contained HTML).")
    parser.add_argument("--results", nargs="+", default=[], metavar="RESULT.json", help="'coclr eval' result files")
    parser.add_argument("--run", metavar="RUN_DIR", help="a 'coclr pipeline' run folder (with manifest.json)")
    parser.add_argument("--store", help="evaluation clip store (required with --run; for --results it overrides "
                        "the store recorded in the results, for the gallery thumbnails)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--gallery-queries", type=int, default=8,
                        help="queries shown in the gallery, at most one per class (default 8)")
    add_clip_arguments(parser, scope="--run: ")
    parser.add_argument("--cache-dir", help="--run: feature cache folder (default OUT/feature_cache)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run_only() -> list[str]:
    """Options that only the evaluation of ``--run`` reads (refused without it, instead of being ignored): every clip
    option (:class:`~coclr.eval.options.ClipConfig`), the device and the feature cache."""
    import dataclasses

    from coclr.eval.options import ClipConfig

    return [*(field.name for field in dataclasses.fields(ClipConfig)), "device", "cache_dir"]


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from coclr.data.datasets import left_out_message
    from coclr.errors import ConfigError, DataError
    from coclr.eval.features import check_cache_dir
    from coclr.eval.report import (
        REPORT_FOLDER,
        check_run_inputs,
        gallery_inputs,
        left_out_line,
        load_record,
        report_options,
        run_warnings,
        write_report,
    )
    from coclr.runfolder import check_folder, claim_folder
    from coclr.store.clipstore import open_store

    if not args.results and not args.run:
        raise ConfigError("--results or --run: give result files, a run folder, or both")
    if args.gallery_queries < 1:  # (0 or less wrote a gallery of no rows)
        raise ConfigError(f"--gallery-queries: must be at least 1, got {args.gallery_queries}")
    if args.run and not args.store:
        raise ConfigError("--store: required with --run (the store to evaluate the run's encoders on)")
    unused = [f"--{key.replace('_', '-')}" for key in run_only() if getattr(args, key) not in (None, False)]
    if unused and not args.run:
        raise ConfigError(f"{', '.join(unused)}: apply to --run only (the evaluation of a pipeline run's stages); "
                          "the result files were evaluated already")
    check_folder(args.out, REPORT_FOLDER, {}, legacy=report_options)  # before any work: a report's folder, or new
    settings = None
    if args.run:  # every refusal of the run, its clips or the device before --out is made
        check_cache_dir(args.cache_dir or Path(args.out) / "feature_cache")
        settings = run_settings(args)
    records = [load_record(path) for path in args.results]
    store = open_store(args.store) if args.store else None
    with_gallery = True
    try:
        gallery_inputs(records, store)  # the gallery's store and videos, before --out is made
    except DataError as error:
        if store is not None:
            raise
        with_gallery = False  # (the table needs no store: it is written, and the gallery said to be left out)
        print(f"coclr report: note: no gallery.html: {error}", file=sys.stderr)
    left_out: dict[str, dict[str, str]] = {}
    run_views: set[str] = set()
    if args.run:  # the store's views and splits, before --out is made too
        stages, left_out = check_run_inputs(args.run, store)
        run_views = {view for stage in stages for view in stage["encoders"]}
        for line in run_warnings(stages, store):
            print(f"coclr report: warning: {line}", file=sys.stderr)
    with claim_folder(args.out, REPORT_FOLDER, {}, legacy=report_options):
        if settings is not None:
            records += evaluate_run(args, store, *settings)
        written = write_report(args.out, records, store, args.gallery_queries, with_gallery)
    plot = Path(args.out) / "stage_recall.png"  # report_run's, of the run's stages
    if args.run:
        written["stage_recall.png"] = plot
    for name in sorted(written):
        print(f"wrote {written[name]}")
    if not args.run and plot.is_file():
        print(f"coclr report: note: {plot} and {Path(args.out) / 'results'} are of an earlier report's --run, not of "
              "this one's inputs", file=sys.stderr)
    gallery = Path(args.out) / "gallery.html"
    if "gallery.html" not in written and gallery.is_file():  # (no retrieval with neighbours among these inputs)
        print(f"coclr report: note: {gallery} is of an earlier report's inputs, not of this one's", file=sys.stderr)
    partial = [line for line in map(left_out_line, records[:len(args.results)]) if line]
    for line in partial:  # (its evaluation ended with exit status 3 too: the figures shown are of the others)
        print(f"coclr report: {line}", file=sys.stderr)
    for split, videos in left_out.items():
        if videos:
            print(f"coclr report: {left_out_message(store, split, sorted(run_views), videos)}", file=sys.stderr)
    return job_status(len(partial) + sum(map(len, left_out.values())))


def run_settings(args: argparse.Namespace) -> tuple[ClipConfig, str]:
    """The clips (:class:`~coclr.eval.features.ClipConfig`: the options given, else what the checkpoints recorded)
    and the device the stages of the pipeline run ``args.run`` are evaluated with; refused in one line when the
    folder is no pipeline run or an option does not apply."""
    from coclr.distributed import pick_device
    from coclr.eval.features import ClipConfig, trained_clips
    from coclr.eval.report import stage_encoders

    encoders = list(dict.fromkeys(path for point in stage_encoders(args.run) for path in point["encoders"].values()))
    clips, sources = trained_clips(encoders, length=args.length, stride=args.stride, size=args.size)
    print("coclr report: clips of " + ", ".join(f"{key} {value} ({sources[key]})" for key, value in clips.items()),
          file=sys.stderr)
    clip_config = config_from_flags(ClipConfig, args, **clips)
    return clip_config, str(pick_device(args.device, "--device"))


def evaluate_run(args: argparse.Namespace, store, clip_config: ClipConfig, device: str) -> list[dict]:
    """The retrieval records of every finished stage of the pipeline run ``args.run`` (written into ``args.out``),
    with the clips and device of :func:`run_settings`."""
    from coclr.atomic import read_json_record
    from coclr.eval.report import finished_stage, report_run

    stages = (read_json_record(os.path.join(args.run, "manifest.json")) or {}).get("stages", [])  # (checked by now)
    unfinished = [str(stage.get("name") if isinstance(stage, dict) else stage) for stage in stages
                  if not finished_stage(stage)]
    if unfinished:  # (a run stopped mid-way was reported as if those were all its stages)
        print(f"coclr report: note: {args.run}: stage(s) {', '.join(unfinished)} not finished: reported are the "
              f"{len(stages) - len(unfinished)} finished ones", file=sys.stderr)
    return report_run(args.run, store, args.out, clip_config, device, args.cache_dir, not args.quiet)
