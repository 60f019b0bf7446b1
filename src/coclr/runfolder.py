"""The one rule of every long command's output folder: the same command continues, another one is refused.

A folder records, in ``run.json``, the command that started it and its resolved options. A later command on the
folder whose options are the same continues the work; one whose options differ is refused before any work, with
each differing option named with both values (:func:`coclr.config.differences`). Options that cannot change the
results (progress bars, worker counts, logging, where to stop) are listed per command as *continuable* and may
change between runs; the record keeps the values the folder was started with. Starting over takes an explicit
``restart``, which moves the old folder aside (``<folder>.replaced-<time>``) rather than deleting it.

Example::

    claim_folder(out, "pretrain", to_dict(config), continuable=PRETRAIN_CONTINUABLE)   # before any work
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from coclr.atomic import atomic_write_json
from coclr.config import differences
from coclr.errors import ConfigError, DataError

RUN_RECORD = "run.json"


def without_keys(options: dict[str, Any], keys: Collection[str]) -> dict[str, Any]:
    """A copy of the nested ``options`` less the dotted ``keys`` (``"run.progress"``)."""
    out = copy.deepcopy(options)
    for key in keys:
        node: Any = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def read_record(folder: str | Path) -> dict[str, Any] | None:
    """The record of ``folder`` (``{"command", "options"}``), or None when it has none."""
    path = Path(folder) / RUN_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: not valid JSON ({error}); it records how the folder was started, so it cannot "
                        "be continued: use another folder") from None
    if not isinstance(record, dict) or "options" not in record:
        raise DataError(f"{path}: not a coclr run record")
    return record


def move_aside(folder: str | Path, command: str) -> Path | None:
    """Start over: move ``folder`` aside (``<folder>.replaced-<time>``) when it exists; returns where it went."""
    folder = Path(folder)
    if not folder.exists():
        return None
    aside = folder.with_name(f"{folder.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.rename(aside)
    print(f"coclr {command}: moved the earlier run in {folder} aside to {aside}", flush=True)
    return aside


def check_folder(folder: str | Path, command: str, options: dict[str, Any], continuable: Collection[str] = (),
                 legacy: Callable[[Path], dict[str, Any] | None] | None = None) -> bool:
    """Whether ``folder`` holds work of the same command and options (to continue); False when it holds none.
    Raises :class:`~coclr.errors.ConfigError` naming every differing option (or the other command).

    ``legacy`` reads the options of a folder written before records existed (e.g. from its checkpoint), None
    when it holds none."""
    folder = Path(folder)
    record = read_record(folder)
    if record is None and legacy is not None and folder.is_dir():
        recorded = legacy(folder)
        record = None if recorded is None else {"command": command, "options": recorded}
    if record is None:
        return False
    if record.get("command", command) != command:
        raise ConfigError(f"{folder} holds the output of `coclr {record.get('command')}`, not of `coclr {command}`: "
                          "use another folder")
    differ = differences(without_keys(record["options"], continuable), without_keys(options, continuable))
    if differ:
        raise ConfigError(f"{folder} holds a {command} run with {', '.join(differ)}; use the same options to continue "
                          "it, another folder, or --restart to move it aside and start over")
    return True


def record_folder(folder: str | Path, command: str, options: dict[str, Any]) -> None:
    """Write the record of ``folder`` unless it has one (a continued run keeps the options it was started with).
    Call it once the work is about to begin, so that a command that failed during its checks records nothing."""
    folder = Path(folder)
    if not (folder / RUN_RECORD).is_file():
        atomic_write_json(folder / RUN_RECORD, {"command": command, "options": options})


def claim_folder(folder: str | Path, command: str, options: dict[str, Any], continuable: Collection[str] = (),
                 restart: bool = False, legacy: Callable[[Path], dict[str, Any] | None] | None = None) -> bool:
    """:func:`check_folder` then :func:`record_folder` (after :func:`move_aside` with ``restart``): for commands
    whose checks are all done before. Returns whether there was work to continue."""
    if restart:
        move_aside(folder, command)
    held = check_folder(folder, command, options, continuable, legacy)
    record_folder(folder, command, options)
    return held
