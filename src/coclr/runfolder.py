"""The one rule of every folder a long command writes: the same command continues, another one is refused.

A folder records the settings it was started with (``run.json`` for pretrain, pipeline, study and finetune
folders; ``embed.json`` for embeddings; ``store.json`` for a clip store and its flow views). A later command on
the folder with the same settings continues the work; one with other settings is refused, naming each differing
key with both values and what to do (:class:`FolderRule`). Keys that cannot change the results (progress bars,
workers, device, where to stop) are listed per kind as ``may_differ``; a kind with ``may_add`` (a store's
metadata) accepts keys it does not record yet and refuses only other values of those it does. Starting over takes
an explicit ``restart`` where the command has one: the old folder is moved aside (``<folder>.replaced-<time>``).

Refused means untouched: every check and the folder's lock come before the first write, so a refused command
leaves the folder byte for byte as it was (:func:`claim_folder`: check, create, lock, check again under the lock,
record; a second job on a locked folder is refused by the lock, which it does not rewrite). Every kind of folder
is claimed so, each with its :class:`FolderRecord` (where its settings are recorded: ``run.json``, ``embed.json``,
a store's ``store.json``) and its lock.

Nothing is overwritten that the command did not write, and no command writes into another's folder: a new output
(a folder no record claims, or a file) is refused, naming what is in the way, when it holds files the command did
not write (:func:`refuse_foreign`) or lies inside a folder that another command owns (:func:`check_place`: a
store, an embedding folder, a run folder; :data:`NESTED` says which outputs a folder may hold, e.g. a study's
stages). Folders and files written without a record of their own (a result file, a page, a feature cache) are
checked by :func:`check_output_file` and :func:`check_output_folder`, with what the command writes there.

Example::

    RULE = FolderRule("pretrain", "a pretrain run", may_differ=("run.progress",), restart=True)
    with claim_folder(out, RULE, to_dict(config), restart=restart) as continued:   # before any work
        ...
"""

from __future__ import annotations

import copy
import fnmatch
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coclr.atomic import PARTIAL_SUFFIX, atomic_write_json, read_json_record, remove_stale_partials
from coclr.config import differences
from coclr.errors import ConfigError, DataError
from coclr.filelock import exclusive_lock, lock_holder

RUN_RECORD = "run.json"
LOCK_FILE = ".lock"
OWNER_RECORDS = {"store.json": ("coclr-clip-store", "data store"), "embed.json": ("coclr-embeddings", "embed")}
"""Records other than ``run.json`` that make a folder a command's output: file name -> (its ``"format"``, the
command); ``run.json`` names its command itself. (``coclr.store.clipstore`` and ``coclr.embed.output`` write them.)"""
STORE_WRITERS = {"data store", "data synth"}
"""The commands that write a store's own files (its ``store.json`` names ``data store`` for both)."""
NESTED: dict[str, tuple[str, ...]] = {
    "study": ("pretrain", "pipeline", "finetune", "data store", "data synth", "flow", "feature cache"),
    "learn": ("data store", "flow", "pipeline", "pretrain", "embed", "curate"),
    "curate": ("embed",),
    "pipeline": ("pretrain",),
    "report": ("feature cache",),
    "data store": ("flow",),
}
"""The outputs a command's folder may hold, by command: the study runs its stages, finetuning and store (of videos,
or synthetic) inside its folder (its evaluation records and report are its own: a user's `coclr eval --out
study/eval/...` replaced one), learn its store, pipeline and embeddings, a pipeline its stages, a report keeps its
feature cache, a store has its flow views, curate the embedding of its altered copies. Any other output inside a
command's folder is refused (:func:`check_place`)."""
PLACES: dict[tuple[str, str], tuple[str, ...]] = {
    ("learn", "curate"): ("curate",),
    ("learn", "embed"): ("embeddings/*", "curate/*"),
    ("pipeline", "pretrain"): ("infonce_*", "cycle*_*"),
}
"""Where a command's folder holds a nested output of another (``(owner, command)`` -> patterns of the path inside
the owner's folder): learn's curation and embeddings are its own, not a place for the user's (a `coclr curate --out
my_learn/curate2` was accepted), and a pipeline's stages are its own (a `coclr pretrain run.out=my_pipeline/mine`
was accepted). Nested outputs not listed may be anywhere inside."""
PREPARING_LOCK = ".lock_preparing"
"""The lock a command holds on its folder before it claims it (:func:`held_before_claim`)."""
BOOKKEEPING = (LOCK_FILE, ".lock_*", f"*{PARTIAL_SUFFIX}")
"""Names of coclr's own bookkeeping files (locks, temporary files of atomic writes), found in any folder it writes:
never counted as files a command did not write."""


class FolderRefused(ConfigError, DataError):
    """A folder holds work started by another command or with other settings; nothing in it was written. Both a
    :class:`ConfigError` (the options differ) and a :class:`DataError` (the folder's content decides)."""


@dataclass(frozen=True)
class FolderRule:
    """How one kind of folder is continued or refused.

    ``command``: the command as typed (``"pretrain"``, ``"data store"``); ``what``: what the folder holds, as in
    "FOLDER holds <what> with ..."; ``may_differ``: dotted keys that may change between runs (the record keeps
    the first values); ``may_add``: only the keys both settings hold are compared (the folder may gain keys,
    and holds keys of other jobs: a store's metadata of each view); ``restart``: whether the command has
    ``--restart``; ``other``: where else to go instead (``"another folder"``); ``paths``: dotted keys whose values
    are file or folder paths, compared and recorded as absolute paths (``store/`` is ``./store``; the same name
    typed in another folder is another store); ``since``: (dotted) keys a later version added, compared only
    where the folder records them (one written before holds what it was never asked to record); ``same``: what
    both settings are read through before they are compared (values an earlier version recorded otherwise);
    ``rooted``: the folder's parts name one another by absolute path (a pipeline's stages start from its other
    stages' checkpoints, a study's and learn's stages train on the store inside them), so it continues only where
    it was made: moved or copied elsewhere, it is refused before any work (:func:`run_record` records the place);
    ``shown``: both settings as a refusal names them, in the words of the command's options (a learn run's budget
    as ``--budget`` takes it, not its seconds); it must keep different values different."""

    command: str
    what: str
    may_differ: tuple[str, ...] = ()
    may_add: bool = False
    restart: bool = False
    other: str = "another folder"
    paths: tuple[str, ...] = ()
    since: tuple[str, ...] = ()
    same: Callable[[Any], Any] | None = None
    rooted: bool = False
    shown: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def differing(self, recorded: dict[str, Any], given: dict[str, Any]) -> list[str]:
        """Every differing key of the two settings, as ``key=<recorded> (given <given>)``."""
        added = [key for key in self.since if not has_key(recorded, key)]  # (on the settings as recorded)
        given = without_keys(given, added)
        if self.same is not None:
            recorded, given = self.same(recorded), self.same(given)
        if self.shown is not None:
            recorded, given = self.shown(recorded), self.shown(given)
        recorded, given = absolute_paths(recorded, self.paths), absolute_paths(given, self.paths)
        recorded, given = without_keys(recorded, self.may_differ), without_keys(given, self.may_differ)
        if self.may_add:  # only the keys both hold: the folder's other keys are other jobs', new ones are added
            shared = [key for key in given if key in recorded]
            recorded, given = {key: recorded[key] for key in shared}, {key: given[key] for key in shared}
        return differences(recorded, given)

    def remedy(self, folder: str | Path | None = None) -> str:
        """What to do instead of the refused command on ``folder``: a folder inside another command's output (a
        pipeline's stage) is not one ``--restart`` may move (:func:`check_restart`), so its owner is named instead."""
        if self.restart:
            owner = next(((parent, folder_owner(parent)) for parent in Path(folder).absolute().parents
                          if folder_owner(parent) is not None), None) if folder is not None else None
            if owner is not None:
                return (f"use the same options to continue it, or {self.other}; it is part of `coclr {owner[1]}`'s "
                        f"output {owner[0]}: restart that command to start over")
            return f"use the same options to continue it, {self.other}, or --restart to move it aside and start over"
        return f"use the same options to continue it, or {self.other}"

    def check(self, folder: str | Path, recorded: dict[str, Any] | None, given: dict[str, Any]) -> bool:
        """Whether ``folder``, recording ``recorded`` (None: nothing yet), may be continued with ``given``
        (False when it records nothing); raises :class:`FolderRefused` naming each differing key."""
        if recorded is None:
            return False
        differ = self.differing(recorded, given)
        if differ:
            raise FolderRefused(f"{folder} holds {self.what} with {', '.join(differ)}; {self.remedy(folder)}")
        return True

    def check_made(self, folder: str | Path, made: Any) -> None:
        """Refuse a :attr:`rooted` ``folder`` that its record says was ``made`` elsewhere (an absolute path; None or
        not text: a folder recorded before the place was, not checked); reads only."""
        if not self.rooted or not isinstance(made, str) or same_folder(made, folder):
            return
        again = "--restart to start over in it" if self.restart else "another folder to start over"
        raise FolderRefused(f"{folder}: made as {made}, and moved or copied since: the runs it holds name their files "
                            f"in that place, so it continues only there; move it back, or use {again}")

    def busy(self, folder: str | Path) -> Callable[[str], str]:
        """The refusal of a second job while ``who`` holds the folder's lock."""
        return lambda who: (f"{folder}: another coclr {self.command} is writing this folder ({who}); wait for it to "
                            "end or stop it, then run this command again")


def has_key(options: dict[str, Any], key: str) -> bool:
    """Whether the nested ``options`` hold the dotted ``key`` (``"run.global_batch"``)."""
    node: Any = options
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


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


def absolute_paths(options: dict[str, Any], keys: Collection[str]) -> dict[str, Any]:
    """A copy of the nested ``options`` with the paths at the dotted ``keys`` made absolute (from the current folder)
    and resolved (a link read through: the same store reached through a linked folder is the same store; an empty
    path, which means none, kept)."""
    out = copy.deepcopy(options)
    for key in keys:
        node: Any = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(leaf), str) and node[leaf]:
            node[leaf] = os.path.realpath(node[leaf])
    return out


def same_folder(made: str, folder: str | Path) -> bool:
    """Whether the path ``made`` (recorded) names ``folder`` still: the same resolved path, or the same folder
    reached another way (a link, a mount)."""
    if os.path.realpath(made) == os.path.realpath(folder):
        return True
    try:
        return os.path.samefile(made, folder)
    except OSError:
        return False


def read_record(folder: str | Path) -> dict[str, Any] | None:
    """The record of ``folder`` (``{"command", "options"}``), or None when it has none."""
    path = Path(folder) / RUN_RECORD
    record = read_json_record(path, "it records how the folder was started, so it cannot be continued: use "
                                    "another folder")
    if record is not None and not isinstance(record.get("options"), dict):
        raise DataError(f"{path}: not a coclr run record (no options)")
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


@dataclass(frozen=True)
class FolderRecord:
    """Where and how a kind of folder records the settings it was started with (:func:`claim_folder`).

    ``name``: the record's file, named in refusals (``run.json``, ``embed.json``, ``store.json``); ``read(folder)``:
    the recorded settings, None when the folder records none (it raises for the record of another command);
    ``write(folder, held)``: called under the lock once the settings were checked again (``held``: the folder
    recorded them already): records a new folder, or adds the keys it lacks (a rule with ``may_add``);
    ``ours(path)``: what a folder without a record may already hold, besides coclr's bookkeeping; ``check(folder)``:
    further read-only checks of a recorded folder (a store's index)."""

    name: str
    read: Callable[[Path], dict[str, Any] | None]
    write: Callable[[Path, bool], Any]
    ours: Callable[[Path], bool] | None = None
    check: Callable[[Path], Any] | None = None


def run_record(rule: FolderRule, options: dict[str, Any]) -> FolderRecord:
    """The record of the folders of pretrain, pipeline, study, finetune, report, learn and the synthetic videos:
    ``run.json``, ``{"command", "options", "folder"}`` (``folder``: its absolute path when made, for a
    :attr:`FolderRule.rooted` kind), written once (a continued run keeps the options it was started with); a folder
    without one may hold the outputs its command nests (:data:`NESTED`)."""
    def read(folder: Path) -> dict[str, Any] | None:
        record = read_record(folder)
        if record is None:
            return None
        if record.get("command", rule.command) != rule.command:
            raise FolderRefused(f"{folder} holds the output of `coclr {record.get('command')}`, not of "
                                f"`coclr {rule.command}`: use another folder")
        rule.check_made(folder, record.get("folder"))
        return record["options"]

    def write(folder: Path, held: bool) -> None:
        if not (folder / RUN_RECORD).is_file():  # (a folder from before records held work without one)
            made = {"folder": os.path.realpath(folder)} if rule.rooted else {}
            atomic_write_json(folder / RUN_RECORD, {"command": rule.command,
                                                    "options": absolute_paths(options, rule.paths), **made})

    return FolderRecord(RUN_RECORD, read, write, ours=lambda path: nested_output(path, rule.command))


def check_folder(folder: str | Path, rule: FolderRule, options: dict[str, Any],
                 legacy: Callable[[Path], dict[str, Any] | None] | None = None,
                 record: FolderRecord | None = None) -> bool:
    """Whether ``folder`` holds work of the same command and options (to continue); False when it holds none.
    Reads only: the pre-check of :func:`claim_folder`, which a command also runs on its own before any work.
    Raises :class:`FolderRefused` naming every differing option (or the other command), or what is in the way of
    a new folder (:func:`check_place`, :func:`refuse_foreign`).

    ``record``: where the folder records its settings (default :func:`run_record`); ``legacy`` reads the options
    of a folder written before records existed (e.g. from its checkpoint), None when it holds none."""
    folder = Path(folder)
    record = record or run_record(rule, options)
    if folder.exists() and not folder.is_dir():
        raise FolderRefused(f"{folder}: exists and is not a folder; give a folder")
    recorded = record.read(folder) if folder.is_dir() else None
    if recorded is None and legacy is not None and folder.is_dir():
        recorded = legacy(folder)
    if recorded is None:  # a new output: not inside another command's folder, and holding nothing of others
        check_place(folder, rule.command)  # (but the outputs it may hold: a study's stage run before the study's)
        try:
            refuse_foreign(folder, rule.command, record.name, record.ours)
        except FolderRefused:
            # The record written since it was read (another process of the same job, or another job, claimed the
            # folder meanwhile: atomic writes, so it is whole): checked as any recorded folder is.
            recorded = record.read(folder)
            if recorded is None:
                raise
        else:
            return False
    rule.check(folder, recorded, options)
    if record.check is not None:
        record.check(folder)
    return True


def check_restart(folder: str | Path, rule: FolderRule, ours: Callable[[Path], bool] | None = None,
                  legacy: Callable[[Path], dict[str, Any] | None] | None = None) -> None:
    """Refuse (reads only) what :func:`restart_folder` must not move: a file, another command's output (the input of
    this one, say), a folder holding files the command did not write (``ours``: what a :class:`FolderRecord` may
    hold, default a run folder's; ``legacy`` as in :func:`check_folder`), and a folder inside another command's output
    (a pipeline's stage, a study's or learn's parts), which that run records as its own: moved aside, it would be lost
    to it. Every process of a job runs it, so that each gets the refusal (not only the one that moves)."""
    folder = Path(folder)
    for parent in folder.absolute().resolve().parents:
        owner = folder_owner(parent)
        if owner is not None:
            raise FolderRefused(f"{folder}: inside {parent}, the output folder of `coclr {owner}`, which records it as "
                                f"its own; --restart would take it from that run: restart `coclr {owner}` instead, "
                                "or give a folder outside it")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FolderRefused(f"{folder}: exists and is not a folder; --restart moves aside only a folder that "
                            f"coclr {rule.command} wrote: give another folder")
    owner = folder_owner(folder)
    if owner is not None and owner != rule.command:
        raise FolderRefused(f"{folder}: the output folder of `coclr {owner}`, not of `coclr {rule.command}`; "
                            "--restart moves aside only its own: give another folder")
    recorded = (folder / RUN_RECORD).is_file()  # (one naming no command, or damaged: a run folder all the same)
    if owner is None and not recorded and (legacy is None or legacy(folder) is None):
        names = foreign_files(folder, ours or (lambda path: nested_output(path, rule.command)))
        if names:
            raise FolderRefused(f"{folder}: holds {_some(names)}, which coclr {rule.command} did not write; "
                                "--restart moves aside only a folder it wrote: give another folder, or move those "
                                "away")


def restart_folder(folder: str | Path, rule: FolderRule, ours: Callable[[Path], bool] | None = None,
                   legacy: Callable[[Path], dict[str, Any] | None] | None = None) -> Path | None:
    """:func:`move_aside` the command's own folder (:func:`check_restart` refuses any other) under its lock, so that a
    running job's folder is never moved from under it."""
    check_restart(folder, rule, ours, legacy)
    folder = Path(folder)
    if not folder.exists():
        return None
    with folder_lock(folder, rule):
        return move_aside(folder, rule.command)


def check_not_busy(folder: str | Path, rule: FolderRule) -> None:
    """Refuse at once, as :func:`folder_lock` would, when another job holds ``folder`` now: for a command that
    measures or probes for a while before it claims its folder (it takes nothing; the claim still locks)."""
    who = lock_holder(Path(folder) / LOCK_FILE)
    if who is not None:
        raise DataError(rule.busy(folder)(who))


@contextmanager
def held_before_claim(folder: str | Path, rule: FolderRule) -> Iterator[None]:
    """Hold ``folder`` from before its claim, for the work a command does first (learn measures the machine for its
    plan), to the end of the ``with`` block: a second job is refused at once (it measured too, on the same cores,
    and was refused only at the claim). The lock is :data:`PREPARING_LOCK`, beside the claim's own (which a
    ``--restart`` moves aside with the folder it holds). The folder made here (and folders above it) is removed
    again when that work stops with an error and leaves it as it was made: a refused plan leaves nothing behind."""
    folder = Path(folder)
    check_not_busy(folder, rule)  # (a job that claimed the folder holds its own lock)
    made = next((path for path in (*reversed(folder.absolute().parents), folder.absolute()) if not path.exists()),
                None)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive_lock(folder / PREPARING_LOCK, rule.busy(folder)):
            yield
    except BaseException:
        if made is not None and all(path.is_dir() or path.name == PREPARING_LOCK for path in made.rglob("*")):
            shutil.rmtree(made, ignore_errors=True)
        raise


@contextmanager
def folder_lock(folder: str | Path, rule: FolderRule) -> Iterator[None]:
    """Hold ``folder/.lock`` (the folder must exist); a second job is refused at once, naming the holder, and
    leaves the lock file as it found it."""
    with exclusive_lock(Path(folder) / LOCK_FILE, rule.busy(folder)):
        yield


@contextmanager
def claim_folder(folder: str | Path, rule: FolderRule, options: dict[str, Any], restart: bool = False,
                 legacy: Callable[[Path], dict[str, Any] | None] | None = None, record: FolderRecord | None = None,
                 lock: Callable[[], AbstractContextManager[Any]] | None = None) -> Iterator[bool]:
    """Hold ``folder`` for the work of a ``with`` block; yields whether there was work to continue. The one claim of
    every kind of folder a command writes (run folders, embeddings, a store's views).

    In this order, so that a refused command writes nothing: :func:`check_folder` (reads only), then the folder
    is created and locked, checked again under the lock (another job may have started it meanwhile), and recorded
    (``record.write``). ``restart`` moves an earlier folder aside first (the one write a refused check cannot undo:
    it is asked for). ``record``: where the settings are recorded (default: ``run.json``, :func:`run_record`);
    ``lock``: the lock that refuses a second job (default :func:`folder_lock`; a store's view lock for its views).
    In a job of several processes, one of them claims the folder (:func:`coclr.distributed.held_by_main`)."""
    folder = Path(folder)
    record = record or run_record(rule, options)
    if restart:
        restart_folder(folder, rule, record.ours, legacy)
    check_folder(folder, rule, options, legacy, record)
    folder.mkdir(parents=True, exist_ok=True)
    with lock() if lock is not None else folder_lock(folder, rule):
        held = check_folder(folder, rule, options, legacy, record)
        record.write(folder, held)
        remove_stale_partials(folder, recursive=False)  # a killed writer's; a subfolder's are its writer's to clean
        yield held


# ------------------------------------------------------------------------- outputs: whose folder, whose files

def folder_owner(folder: str | Path) -> str | None:
    """The command whose output ``folder`` is, by the record it holds (``run.json``, :data:`OWNER_RECORDS`); None
    when it holds none (an unreadable or foreign record counts as none: this only decides where outputs may go)."""
    folder = Path(folder)
    try:
        record = read_record(folder)
    except (DataError, OSError):
        record = None
    if record is not None and isinstance(record.get("command"), str):
        return record["command"]
    for name, (format_name, command) in OWNER_RECORDS.items():
        try:
            if (read_json_record(folder / name) or {}).get("format") == format_name:
                return command
        except (DataError, OSError):
            continue
    return None


VIDEO_OUTPUTS = ("data synth --videos",)
"""The commands whose output folders hold videos to learn from."""


def scanned_past(folder: str | Path) -> str | None:
    """The command whose output ``folder`` is, when a scan for videos must not enter it (every command's output but
    :data:`VIDEO_OUTPUTS`: a store's frames, a curation's altered copies, embeddings: an output kept inside the
    input folder is not input); None for any other folder."""
    owner = folder_owner(folder)
    return owner if owner is not None and owner not in VIDEO_OUTPUTS else None


def left_out_note(root: str | Path, outputs: list[str]) -> str:
    """The one line a scan of ``root`` for videos writes of the output folders it did not enter
    (:func:`scanned_past`; ``outputs``: each as "path (coclr command)"), a few named."""
    more = f" and {len(outputs) - 3} more" if len(outputs) > 3 else ""
    return f"{root}: left out {len(outputs)} folder(s) of coclr's own outputs: {', '.join(outputs[:3])}{more}"


def nested_output(path: Path, command: str) -> bool:
    """Whether ``path`` is a folder that ``command``'s folder may hold (:data:`NESTED`), e.g. a pipeline's stage,
    written by ``coclr pretrain`` before the pipeline recorded its own folder."""
    return path.is_dir() and folder_owner(path) in NESTED.get(command, ())


def check_place(path: str | Path, command: str) -> None:
    """Refuse a new output ``path`` (a folder or a file) of ``command`` that lies inside a folder another command
    owns (:func:`folder_owner`) and may not hold it (:data:`NESTED`): e.g. a page in an embedding folder, a store in
    a run folder. Reads only; raises :class:`FolderRefused` naming the folder and its command."""
    path = Path(path)
    resolved = path.absolute().resolve()
    for parent in resolved.parents:
        owner = folder_owner(parent)
        places = PLACES.get((owner, command)) if owner is not None else None
        if owner is not None and (command not in NESTED.get(owner, ()) or places is not None and not any(
                fnmatch.fnmatchcase(resolved.relative_to(parent).as_posix(), place) for place in places)):
            raise FolderRefused(f"{path}: inside {parent}, the output folder of `coclr {owner}`, which coclr {command} "
                                "must not write into; give a path outside it")


def check_writable(path: str | Path, kind: str = "folder") -> None:
    """Refuse, in one line and before any work, an output ``path`` that this process cannot create or write into:
    a folder (``kind="folder"``), itself when it exists, else the nearest folder above it that exists; a file
    (``kind="file"``, written by replacing it: :func:`coclr.atomic.atomic_open`), the nearest folder above it that
    exists (a probe file made there and removed at once: :func:`_can_create_in`; nothing else is written)."""
    path = Path(path).absolute()
    start = path if kind == "folder" else path.parent
    existing = next((folder for folder in (start, *start.parents) if folder.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        raise FolderRefused(f"{path}: {existing} is a file, not a folder; give another output {kind}")
    if not _can_create_in(existing):
        made = "created" if kind == "folder" else "written"
        where = "it" if existing == path else f"{existing}, where it would be {made},"
        raise FolderRefused(f"{path}: {where} cannot be written by this user (permission denied, or a read-only "
                            f"file system); give another output {kind}")


def _can_create_in(folder: Path) -> bool:
    """Whether this process can create a file in ``folder``: tried, with a bookkeeping name removed at once (the
    permission bits do not tell: root passes them where a file system refuses, e.g. /sys or a read-only mount)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        handle, name = tempfile.mkstemp(dir=folder, prefix=f".coclr-probe.{os.getpid()}.", suffix=PARTIAL_SUFFIX)
    except OSError:
        return False
    os.close(handle)
    os.unlink(name)
    return True


def foreign_files(folder: str | Path, ours: Callable[[Path], bool] | None = None) -> list[str]:
    """The names of what ``folder`` holds (directly) that is neither coclr's bookkeeping (:data:`BOOKKEEPING`) nor
    ``ours(path)``, sorted; [] for a folder that does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir()
                  if not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in BOOKKEEPING)
                  and not (ours is not None and ours(entry)))


def refuse_foreign(folder: str | Path, command: str, record: str,
                   ours: Callable[[Path], bool] | None = None) -> None:
    """Refuse to write ``folder`` for ``command`` when it holds files the command did not write (a folder without
    ``record``, the file that would say it did): one line naming them (:func:`foreign_files`)."""
    names = foreign_files(folder, ours)
    owner = folder_owner(folder) if names else None
    if (owner is not None and owner != command and {owner, command} - STORE_WRITERS
            and command not in NESTED.get(owner, ())):  # (a folder of data synth --videos: "which data synth did
        # not write"; a store: "move those away"; but flow writes into a store)
        raise FolderRefused(f"{folder}: the output folder of `coclr {owner}`, not of `coclr {command}`; give another "
                            "folder")
    if names:
        raise FolderRefused(f"{folder}: holds {_some(names)}, which coclr {command} did not write (it writes a new or "
                            f"empty folder, or one with its {record}); give another folder, or move those away")


def check_output_folder(folder: str | Path, command: str, ours: Callable[[Path], bool], what: str) -> None:
    """The checks of a folder ``command`` writes without a record of its own (a feature cache, a work folder): not
    inside another command's folder (:func:`check_place`), holding only what ``ours`` recognises (``what`` the
    command writes there, for the message), and one this process can write (:func:`check_writable`: a cache on a
    read-only mount was refused only after the features it was to keep had been computed)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FolderRefused(f"{folder}: exists and is not a folder; give a folder")
    check_place(folder, command)
    names = foreign_files(folder, ours)
    if names:
        raise FolderRefused(f"{folder}: holds {_some(names)}, which coclr {command} did not write (it writes only "
                            f"{what} there); give another folder, or move those away")
    check_writable(folder)


def check_output_file(path: str | Path, command: str, ours: Callable[[Path], bool], what: str) -> None:
    """The checks of a file ``command`` writes (a result, an index, a page): not inside another command's folder
    (:func:`check_place`), not a folder, and, when it exists, recognised by ``ours`` as ``what`` the command wrote
    before (then it is rewritten), not a link to nothing, and in a folder this process can write
    (:func:`check_writable`); raises :class:`FolderRefused` in one line, and leaves everything as it was."""
    path = Path(path)
    check_place(path, command)
    if path.is_dir():
        raise FolderRefused(f"{path}: is a folder; give the path of a file")
    folder = next((part for part in path.parents if part.exists()), None)
    if folder is not None and not folder.is_dir():
        raise FolderRefused(f"{folder}: is a file, where {path} needs a folder; give another path")
    if path.is_symlink() and not path.exists():
        raise FolderRefused(f"{path}: a link to {os.readlink(path)}, which does not exist; give another path, or "
                            "make what it names")
    if path.exists() and not ours(path):
        raise FolderRefused(f"{path}: exists and is not {what} (what coclr {command} writes there), so it was not "
                            "written by it; give another path, or move it away")
    check_writable(path, "file")


def _some(names: Sequence[str], shown: int = 5) -> str:
    """Up to ``shown`` names, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
