"""``coclr data synth``: generate the built-in synthetic dataset (wired into ``coclr data``)."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments, print_options

PRESETS = ("default", "study")
"""default: the generator's own defaults; study: the quick study's dataset (``coclr demo``, the study's default
data: :data:`coclr.study.config.STUDY_SYNTH`)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "synth",
        help="generate the built-in synthetic dataset (motion defines the class, appearance does not)",
        description="Generate the built-in synthetic dataset, deterministically from a seed: into a clip store "
        "(--out), or as MP4 files with neutral names and their labels apart (--videos DIR: DIR/videos/*.mp4 and "
        "DIR/labels.csv, the --format csv manifest path,label,split,group), to learn from as from one's own footage "
        "and score against labels the learning never saw. Options of the generator are given as key=value (see "
        "--list-options), over the preset's.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", help="output store directory")
    where.add_argument("--videos", metavar="DIR", help="write the clips as video files: DIR/videos/<name>.mp4 and "
                       "DIR/labels.csv")
    parser.add_argument("--preset", choices=PRESETS, default="default",
                        help="default: the generator's defaults; study: the quick study's dataset (coclr demo's: "
                        "384 train and 384 test clips of 12 frames, 32x32, eight classes)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (the dataset is a function of it)")
    parser.add_argument("--workers", type=int, help="worker processes rendering the clip store of --out (default: "
                        "one per core; 0: none, work in this process, as DataLoader's num_workers); --videos writes "
                        "its files in this process")
    add_config_arguments(parser, example="train_scenes=8")
    parser.set_defaults(func=run, seed=None)  # None: --seed not given (seed=N or a config file's seed may set it)


def run(args: argparse.Namespace) -> int:
    from coclr.cli._status import job_status
    from coclr.errors import ConfigError
    from coclr.synth import SynthConfig, dataset_clips, generate_synthetic, write_videos

    if args.list_options:  # (with the preset's values: those the overrides go over)
        print_options(SynthConfig, preset=preset_options(args.preset))
        return 0
    if not args.out and not args.videos:
        raise ConfigError("give --out STORE (a clip store) or --videos DIR (video files and their labels)")
    config = synth_config(args.config, args.overrides, args.seed, preset_options(args.preset))
    if args.videos:
        if args.workers is not None:  # (x264 on one thread, as the videos' bytes must not depend on the machine)
            raise ConfigError("--workers: applies to --out (the clip store); --videos writes its files in this "
                              "process: leave --workers out")
        manifest = write_videos(args.videos, config)
        print(f"{len(dataset_clips(config))} videos of the synthetic dataset (seed {config.seed}, {config.frames} "
              f"frames of {config.width}x{config.height}) in {args.videos}/videos; their labels, splits and source "
              f"groups in {manifest}")
        return 0
    summary = generate_synthetic(args.out, config, workers=args.workers)
    print(summary)
    return job_status(len(summary.job.failed))


def preset_options(preset: str) -> dict:
    """The generator's options of a preset (over its defaults)."""
    if preset == "study":
        from coclr.study.config import STUDY_SYNTH

        return dict(STUDY_SYNTH)
    return {}


def synth_config(path: str | None, overrides: list[str], seed: int | None, base: dict | None = None):
    """The generator's options: the preset's (``base``), then the config file, then ``key=value`` overrides, then
    ``--seed``: a seed given by ``--seed`` and by the file or an override with another value is refused in one
    line, never silently replaced."""
    from coclr.config import load_config, read_yaml
    from coclr.errors import ConfigError
    from coclr.synth import SynthConfig

    config = load_config(SynthConfig, path, overrides, base=base)
    if seed is None:
        return config
    from_overrides = any(override.split("=", 1)[0].strip() == "seed" for override in overrides)
    from_file = path is not None and "seed" in read_yaml(path)
    if (from_overrides or from_file) and config.seed != seed:
        where = "the seed=N override" if from_overrides else f"the config file {path}"
        raise ConfigError(f"seed: --seed {seed} disagrees with seed {config.seed} from {where}; give the seed once")
    return load_config(SynthConfig, path, [*overrides, f"seed={seed}"], base=base)
