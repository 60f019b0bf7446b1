"""``coclr data``: build dataset indexes and clip stores, inspect stores, generate the synthetic dataset.

Examples::

    coclr data index --format ucf101 --annotations ucfTrainTestlist --split 1 --root UCF-101 --out ucf1.json
    coclr data store --index ucf1.json --root UCF-101 --out stores/ucf101 --short-side 128
    coclr data info stores/ucf101 --verify
"""

from __future__ import annotations

import argparse

from coclr.cli import _synth
from coclr.cli._options import add_option_flags, options_from_flags
from coclr.cli._status import job_status
from coclr.errors import DataError
from coclr.store.options import InfoOptions, StoreOptions, VerifyOptions
from coclr.video.options import FORMATS, IndexOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="datasets: indexes, clip stores, the synthetic dataset",
                                   description="Build dataset indexes and clip stores, inspect stores, and "
                                   "generate the built-in synthetic dataset.")
    data_subparsers = parser.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")

    index = data_subparsers.add_parser(
        "index", help="build a dataset index (JSON) from official split files, a folder or a CSV",
        description="Build a dataset index. ucf101: --annotations is the folder of classInd.txt, "
        "trainlist0N.txt, testlist0N.txt; hmdb51: the folder of <class>_test_split<N>.txt; kinetics: the "
        "annotation CSV(s) (label,youtube_id,time_start,time_end,split), videos looked for under --root; "
        "folder: --root laid out <class>/<video> (or <split>/<class>/<video>), or with --unlabelled any tree of "
        "videos; csv: a manifest path,label[,split[,group]] (without a label column, or with empty label cells: "
        "videos without labels). With --root, videos missing on disk are reported (all at once).")
    index.add_argument("--format", required=True, choices=FORMATS, help="dataset layout")
    add_option_flags(index, IndexOptions)
    index.add_argument("--out", required=True, help="output index JSON file (new, or an index: rewritten)")
    index.set_defaults(func=run_index)

    store = data_subparsers.add_parser(
        "store", help="decode the videos of an index once into a clip store (resumable, parallel)",
        description="Decode every video of an index into resized JPEG frames packed one file per video "
        "(the 'rgb' view). Resumable: run it again after an interruption and it skips complete videos. "
        "Undecodable videos are skipped and listed in OUT/failed_rgb.json; training and evaluation leave them out. "
        "Given an updated index (videos added or removed), it updates the store in place and decodes only the "
        "new videos.")
    store.add_argument("--index", required=True, help="index JSON (from `coclr data index`)")
    store.add_argument("--root", required=True, help="folder of the videos")
    store.add_argument("--out", required=True, help="store folder: new or empty, or a store this command built (a "
                       "folder of other files is refused)")
    add_option_flags(store, StoreOptions)
    store.set_defaults(func=run_store)

    info = data_subparsers.add_parser("info", help="summarise a clip store: splits, classes, views",
                                      description="Print a store's index summary, metadata and the "
                                      "completeness of each view.")
    info.add_argument("store", help="store folder")
    add_option_flags(info, InfoOptions)
    info.set_defaults(func=run_info)

    verify = data_subparsers.add_parser(
        "verify", help="check every entry of a clip store against its checksums (and decode it)",
        description="Read every entry of every view (or --view) and check its bytes against the checksums written "
        "with it; a damaged entry is named and listed in STORE/failed_<view>.json, so training and evaluation leave "
        "it out and the next `coclr data store` / `coclr flow` rebuilds it; a missing entry is named too. Exit status "
        "3 when an entry is damaged or missing.")
    verify.add_argument("store", help="store folder")
    add_option_flags(verify, VerifyOptions)
    verify.set_defaults(func=run_verify)

    _synth.register(data_subparsers)


def run_index(args: argparse.Namespace) -> int:
    from coclr.runfolder import check_output_file
    from coclr.video import indexes

    check_output_file(args.out, "data index", indexes.is_index_file, "a coclr video index")
    options = options_from_flags(IndexOptions, args)
    options.check(args.format)
    annotations = options.annotations or []
    notes: list[str] = []
    if args.format == "ucf101":
        index = indexes.ucf101_index(annotations[0], options.split)
    elif args.format == "hmdb51":
        index = indexes.hmdb51_index(annotations[0], options.split)
    elif args.format == "kinetics":
        index = indexes.kinetics_index(annotations, options.root, notes=notes)
    elif args.format == "folder" and options.unlabelled:
        index = indexes.tree_index(options.root, test_fraction=options.test_fraction, seed=options.seed, notes=notes)
    elif args.format == "folder":
        index = indexes.folder_index(options.root, test_fraction=options.test_fraction, seed=options.seed, notes=notes)
    else:
        index = indexes.csv_index(annotations[0])
    for note in notes:
        print(f"note: {note}")
    if options.name:
        index.name = options.name
    if options.root:
        missing = indexes.missing_videos(index, options.root)
        if missing and options.drop_missing:
            if len(missing) == len(index):  # (an index of no video was written, exit 0)
                raise DataError(f"all {len(index)} videos of index {index.name!r} are missing under {options.root} "
                                f"(the first: {missing[0]}): check --root, which the paths are relative to")
            index = index.without(missing)
            print(f"left out {len(missing)} videos missing under {options.root}")
        elif missing:
            indexes.check_videos_exist(index, options.root, "restore them, or give --drop-missing to leave them out")
    else:
        print("note: no --root given, so the videos were not checked")
    if not len(index):
        raise DataError(f"index {index.name!r} lists no video: its annotations name none" +
                        (" with a label" if args.format == "kinetics" else "") + "; nothing written")
    index.save(args.out)
    counts = ", ".join(f"{split} {n}" for split, n in index.split_counts().items())
    unlabelled = len(index.unlabelled())
    labels = (f"{len(index.classes)} classes" if not unlabelled else "no labels" if unlabelled == len(index)
              else f"{len(index.classes)} classes, {unlabelled} videos without a label")
    print(f"index {index.name!r}: {labels}, {len(index)} videos ({counts}) -> {args.out}")
    if unlabelled:
        print("note: videos without labels train InfoNCE, CoCLR and CMC; evaluation and UberNCE need labels")
    elif "test" not in index.split_counts() and "val" in index.split_counts():
        print("note: no video is in a test split (evaluation's default): evaluate on the validation videos with "
              "--test-split val (coclr eval), as Kinetics-400 is")
    elif "test" not in index.split_counts():
        print("note: no video is in a test split, which evaluation (coclr eval, coclr report) needs: lay the folder "
              "out as <split>/<class>/<video>, or give --test-fraction (--format folder) or a split column (csv)")
    if not unlabelled:  # (a train/val index, Kinetics' layout, too)
        for note in indexes.split_class_notes(index):
            print(f"note: {note}")
    return 0


def run_store(args: argparse.Namespace) -> int:
    from coclr.progress import write
    from coclr.store.build import build_store
    from coclr.video.indexes import VideoIndex

    options = options_from_flags(StoreOptions, args)
    index = VideoIndex.load(args.index)
    summary = build_store(index, args.root, args.out, short_side=options.short_side or None,
                          quality=options.quality, fps=options.fps, workers=options.workers,
                          announce=write)  # (said at once: a job interrupted has said it too)
    print(summary)
    return job_status(len(summary.failed))


def run_info(args: argparse.Namespace) -> int:
    from coclr.store.clipstore import failures_path, open_store
    from coclr.store.verify import recorded_views

    options = options_from_flags(InfoOptions, args)
    store = open_store(args.store)
    index = store.index
    print(f"store {store.root}: index {index.name!r}, {len(index)} videos, {len(index.classes)} classes")
    for split, count in index.split_counts().items():
        per_class = [n for n in index.class_counts(split) if n]
        unlabelled = len(index.unlabelled([split]))
        classes = (f" in {len(per_class)} classes ({min(per_class)}-{max(per_class)} per class)" if per_class
                   else "")
        none = "" if not unlabelled else " without labels" if unlabelled == count else f", {unlabelled} without a label"
        print(f"  {split}: {count} videos{classes}{none}")
    if store.meta:
        print("  built with: " + ", ".join(f"{k}={v}" for k, v in sorted(store.meta.items())))
    views = recorded_views(store)  # (a view whose folder was deleted: "no views yet", every entry unsaid)
    if not views:
        print("  no views yet")
    keys = store.keys()
    listed = set(keys)
    bad = 0
    for view in views:
        complete = sum(store.has(key, view) for key in keys)
        print(f"  view {view!r}: {complete}/{len(keys)} entries complete ({100 * complete / max(1, len(keys)):.1f}%)")
        failed = {key: reason for key, reason in store.failed(view).items() if key in listed}  # (of the index's)
        if failed:
            present = sum(store.has(key, view) for key in failed)
            damaged_text = f", {present} of them damaged entries" if present else ""
            print(f"    {len(failed)} failed{damaged_text} (left out of training and evaluation), listed in "
                  f"{failures_path(store.root, view)}")
        unlisted = store.unlisted(view)
        if unlisted:
            print(f"    {len(unlisted)} entries of videos no longer in the index (kept on disk)")
        if options.verify:
            bad += show_verify(store, view, options.decode, indent="    ")
    return job_status(bad)


def run_verify(args: argparse.Namespace) -> int:
    from coclr.store.clipstore import open_store
    from coclr.store.verify import check_views

    options = options_from_flags(VerifyOptions, args)
    store = open_store(args.store)
    return job_status(sum(show_verify(store, view, options.decode, options.add)
                          for view in check_views(store, options.view)))


def show_verify(store, view: str, decode: bool = False, add: bool = False, indent: str = "") -> int:
    """Check every entry of ``view`` (:func:`coclr.store.verify.verify_view`) and say what was found: one line per
    missing or damaged entry, naming its video, then the counts and what to do. Returns how many entries are
    missing or damaged (the exit status is 3 when any is)."""
    from coclr.progress import write
    from coclr.store.clipstore import failures_path
    from coclr.store.verify import verify_view

    found = verify_view(store, view, decode, add, on_problem=lambda line: write(f"{indent}{line}"))
    counts = found.counts
    shown = ("verified", "damaged", "missing")
    print(f"{indent}{view}: " + ", ".join(f"{n} {what}" for what, n in counts.items() if n or what in shown))
    if found.unlisted:
        print(f"{indent}  {found.unlisted} damaged entries could not be listed in {failures_path(store.root, view)} "
              "(the store may not be written): training and evaluation cannot leave them out; make the store writable "
              "and verify it again")
    elif counts["damaged"]:
        print(f"{indent}  damaged entries are listed in {failures_path(store.root, view)}: training and evaluation "
              "leave them out, and the next run of the job that writes the view rebuilds them")
    if counts["missing"]:
        print(f"{indent}  missing entries: the next run of the job that writes the view (`{store.rgb_command()}` for "
              "rgb, `coclr flow` for a flow view) writes them; until then training and evaluation leave out those "
              f"whose job failed (listed in {failures_path(store.root, view)}) and refuse the view for the others")
    if counts["unverified"]:
        print(f"{indent}  {counts['unverified']} entries were written before checksums (unverified): "
              f"`coclr data verify {store.root} --add` checks them and adds checksums")
    return found.bad
