"""``coclr study``: every row of the paper's Table 1 from one configuration, resumable, on CPU or GPUs."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_config_arguments, print_options


def add_study_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """The options ``coclr study`` and ``coclr demo`` share."""
    parser.add_argument("--out", default=out, help=f"output folder (default: {out})")
    parser.add_argument("--seed", type=int, help="seed of the data, training and evaluation (default: the config's)")
    parser.add_argument("--seeds", nargs="+", metavar="SEED",
                        help="run the study once per seed (OUT/seed<S>) and report every number's mean and standard "
                        "deviation and how many seeds each claim held on (OUT/seeds.md)")
    parser.add_argument("--check", action="store_true",
                        help="check every option and path and print the plan, without running anything")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "study", help="the paper's Table 1: every row and column from one config (resumable)",
        description="Train and evaluate the rows of the paper's Table 1 (InfoNCE, UberNCE, Cross-Entropy, CMC, "
        "CoCLR and its ablations) on one dataset, sharing the stages they have in common, and write the table "
        "beside the paper's numbers, the paper's claims checked on it, the stage plot and the retrieval gallery "
        "into --out. Without --config: the quick study of `coclr demo`; configs/study_demo.yaml (every row on the "
        "built-in data) and configs/study_ucf101.yaml (UCF101) are the others. Running it again continues; other "
        "options are refused, naming each.")
    add_study_arguments(parser, "study_out")
    add_config_arguments(parser, example="schedule.cycles=1")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from coclr.config import load_config, refuse_repeated
    from coclr.errors import ConfigError
    from coclr.study.config import StudyConfig

    if args.list_options:
        print_options(StudyConfig)
        return 0
    if args.seeds:  # the seeds end at the first key=value, which argparse would take for one more seed
        overrides = [token for token in args.seeds if not token.lstrip("-").isdigit()]
        if len(overrides) == len(args.seeds):  # (--seeds followed by overrides only: a study of one seed, in silence)
            raise ConfigError("--seeds: give at least one seed before the key=value options (e.g. --seeds 0 1 2)")
        args.seeds = check_seeds([int(token) for token in args.seeds if token.lstrip("-").isdigit()])
        args.overrides = [*overrides, *args.overrides]
        refuse_repeated(args.overrides)  # (main saw only those after the seeds)
    given = [name for name, there in (("--seeds", args.seeds), ("--seed", args.seed is not None),
                                      ("seed=", any(o.startswith("seed=") for o in args.overrides))) if there]
    if len(given) > 1:  # (the later one replaced the earlier without a word)
        raise ConfigError(f"{' and '.join(given)}: each gives the seed; give one of them")
    overrides = [*args.overrides, *([f"seed={args.seed}"] if args.seed is not None else [])]
    config = load_config(StudyConfig, args.config, overrides)
    return report(config, args)


def report(config, args: argparse.Namespace) -> int:
    """Run the study (or its seeds) and print its results."""
    from pathlib import Path

    from coclr.cli._status import EXIT_DONE, EXIT_SOME_FAILED
    from coclr.study.results import every_row_collapsed
    from coclr.study.run import run_seeds, run_study

    if args.seeds:
        summary = run_seeds(config, args.out, args.seeds, args.check)
        if summary is None:
            return EXIT_DONE
        print((Path(args.out) / "seeds.md").read_text())
        if summary.get("failed_inputs"):  # (as one seed's study: some inputs failed and were left out)
            print(f"some inputs failed and were left out, on seed(s) {', '.join(summary['failed_inputs'])}: "
                  "each seed's results.md lists them")
        if summary.get("all_collapsed"):
            print(f"every row's encoder collapsed on seed(s) {', '.join(summary['all_collapsed'])}: "
                  f"{NOTHING_LEARNT}")
        return EXIT_SOME_FAILED if summary.get("failed_inputs") or summary.get("all_collapsed") else EXIT_DONE
    results = run_study(config, args.out, args.check)
    if results is None:
        return EXIT_DONE
    print((Path(args.out) / "results.md").read_text())
    print(f"this command took {results['wall_seconds'] / 60:.1f} min; results in {args.out}/")
    if every_row_collapsed(results["rows"]):
        print(f"every row's encoder collapsed: {NOTHING_LEARNT}")
    # (failed inputs are listed in results.md above: the study's figures leave them out)
    return EXIT_SOME_FAILED if results.get("failed_inputs") or every_row_collapsed(results["rows"]) else EXIT_DONE


NOTHING_LEARNT = ("the study learnt nothing it could compare (each is marked collapsed in results.md); try longer "
                  "stages (schedule.*), more videos, or another seed")


def check_seeds(seeds: list[int]) -> list[int]:
    """The seeds of ``--seeds``, refused in one line when one repeats (the same run counted twice would report two
    agreeing seeds, +- 0.0) or is negative."""
    from coclr.errors import ConfigError

    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise ConfigError(f"--seeds: {', '.join(map(str, repeated))} given more than once; each seed must be "
                          "a different run")
    negative = [seed for seed in seeds if seed < 0]
    if negative:
        raise ConfigError(f"--seeds: must be non-negative, got {', '.join(map(str, negative))}")
    return seeds
