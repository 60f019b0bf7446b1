"""Shared command-line plumbing for commands configured by a YAML file plus ``key=value`` overrides."""

from __future__ import annotations

import argparse


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``, ``--list-options`` and trailing ``key=value`` overrides."""
    parser.add_argument("--config", help="YAML file of options (see configs/)")
    parser.add_argument("--list-options", action="store_true", help="print every option with its default and help")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="option overrides, e.g. optim.lr=0.0005")


def print_options(config_class: type) -> None:
    from coclr.config import describe

    for key, default, text in describe(config_class):
        print(f"{key} = {default}\n    {text}")
