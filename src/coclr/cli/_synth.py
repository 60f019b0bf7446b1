"""``coclr data synth``: generate the built-in synthetic dataset (wired into ``coclr data``)."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments, print_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "synth",
        help="generate the built-in synthetic dataset (motion defines the class, appearance does not)",
        description="Generate the built-in synthetic dataset into a clip store, deterministically from a "
        "seed. Options of the generator are given as key=value (see --list-options).",
    )
    parser.add_argument("--out", required=True, help="output store directory")
    parser.add_argument("--seed", type=int, default=0, help="random seed (the dataset is a function of it)")
    parser.add_argument("--workers", type=int, help="worker processes (default: one per core; 0: none, work in this "
                        "process, as DataLoader's num_workers)")
    add_config_arguments(parser, example="train_scenes=8")
    parser.set_defaults(func=run, seed=None)  # None: --seed not given (seed=N or a config file's seed may set it)


def run(args: argparse.Namespace) -> int:
    from coclr.synth import SynthConfig, generate_synthetic

    if args.list_options:
        print_options(SynthConfig)
        return 0
    config = synth_config(args.config, args.overrides, args.seed)
    summary = generate_synthetic(args.out, config, workers=args.workers)
    print(summary)
    return 0


def synth_config(path: str | None, overrides: list[str], seed: int | None):
    """The generator's options from the config file, then ``key=value`` overrides, then ``--seed``: a seed given by
    ``--seed`` and by the file or an override with another value is refused in one line, never silently replaced."""
    from coclr.config import load_config, read_yaml
    from coclr.errors import ConfigError
    from coclr.synth import SynthConfig

    config = load_config(SynthConfig, path, overrides)
    if seed is None:
        return config
    from_overrides = any(override.split("=", 1)[0].strip() == "seed" for override in overrides)
    from_file = path is not None and "seed" in read_yaml(path)
    if (from_overrides or from_file) and config.seed != seed:
        where = "the seed=N override" if from_overrides else f"the config file {path}"
        raise ConfigError(f"seed: --seed {seed} disagrees with seed {config.seed} from {where}; give the seed once")
    return load_config(SynthConfig, path, [*overrides, f"seed={seed}"])
