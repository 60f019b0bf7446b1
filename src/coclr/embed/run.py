"""``coclr embed`` as a library function: expand the inputs, skip what the folder has, embed the rest into it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy

from coclr.atomic import file_identity
from coclr.distributed import all_gather_objects, barrier, broadcast_object, is_distributed, rank, world_size
from coclr.embed.embedder import Embedder, EmbedFailure
from coclr.embed.inputs import expand_inputs, known_names
from coclr.embed.options import EmbedJob
from coclr.embed.output import CHECKPOINTS, ChunkWriter, EmbeddingWriter, read_settings
from coclr.errors import CheckpointError, CoclrError, ConfigError, DataError
from coclr.interrupts import interrupted
from coclr.models.loading import checkpoint_format, checkpoint_sha256
from coclr.store.jobs import shard
from coclr.text import shown
from coclr.threads import freed_memory_reused
from coclr.version import __version__
from coclr.video.decode import DAMAGE_TOLERANCE


@dataclasses.dataclass
class EmbedSummary:
    """What a run did: videos embedded, skipped (already in the folder, or failed before unchanged), failed
    (path, message), failed before (path, the earlier message: skipped while unchanged, still not embedded), windows
    embedded, rows dropped (path -> reason: files removed or changed since embedded),
    notes on the inputs (symbolic-link loops, duplicates, files that are not videos), the videos embedded with
    damaged frames (path, count: kept, below the decoder's tolerance, and marked in videos.jsonl), and the
    wall-clock seconds. In a distributed job the counts are those of all processes."""

    out: Path
    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    failed_before: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    windows: int = 0
    dropped: dict[str, str] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    damaged: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    world: int = 1

    def __str__(self) -> str:
        rate = self.done / self.seconds if self.seconds > 0 else 0.0
        window_rate = self.windows / self.seconds if self.seconds > 0 else 0.0
        lines = list(self.notes)
        if self.dropped:
            named = ", ".join(f"{path} ({reason})" for path, reason in list(self.dropped.items())[:5])
            more = f" and {len(self.dropped) - 5} more" if len(self.dropped) > 5 else ""
            lines.append(f"{self.out}: dropped the rows of {len(self.dropped)} files removed or changed since they "
                         f"were embedded and not among this run's inputs (their rows are no longer served): "
                         f"{named}{more}")
        processes = f" by {self.world} processes" if self.world > 1 else ""
        before = len(self.failed_before)
        lines.append(f"{self.out}: {self.done} videos embedded{processes} ({self.windows} windows), {self.skipped} "
                     f"skipped ({self.skipped - before} already there, {before} failed before and unchanged), "
                     f"{len(self.failed)} failed; {self.seconds:.1f} s ({rate:.2f} videos/s, {window_rate:.1f} "
                     "windows/s)")
        for label, failures in (("failed", self.failed), ("failed before, unchanged", self.failed_before)):
            lines += [f"  {label}: {message}" for _, message in failures[:20]]
            if len(failures) > 20:
                lines.append(f"  ... and {len(failures) - 20} more, listed in {self.out / 'failed.jsonl'}")
        if self.failed or self.failed_before:
            lines.append("  a failed video's earlier row, if any, is dropped; it is tried again once the file changes "
                         "(or with --retry-failed)")
        lines += [f"  damaged: {path}: {count} damaged frames (reported corrupt, predicted from one, or lost at the "
                  f"damage), within the {100 * DAMAGE_TOLERANCE:.0f}% tolerated: embedded, marked \"damaged_frames\" "
                  "in videos.jsonl" for path, count in self.damaged[:20]]
        if len(self.damaged) > 20:
            lines.append(f"  ... and {len(self.damaged) - 20} more videos with damaged frames (videos.jsonl)")
        return "\n".join(map(shown, lines))


def folder_record(embedder: Embedder) -> dict[str, Any]:
    """What ``embed.json`` records: the settings (with the checkpoints' content hashes, which a rerun must
    match), the checkpoint files, the dimension and the library versions."""

    checkpoints = {"checkpoint": embedder.checkpoint, "flow_checkpoint": embedder.flow_checkpoint}
    described = {name: None if path is None else {"path": os.path.abspath(path), "sha256": checkpoint_sha256(path),
                                                   "format": checkpoint_format(path)}
                 for name, path in checkpoints.items()}
    settings = embedder.settings.to_dict()
    settings.update({f"{name}_sha256": None if info is None else info["sha256"] for name, info in described.items()})
    return {"settings": settings, **described, "dim": embedder.dim, "versions": library_versions()}


def library_versions() -> dict[str, str]:
    """The versions of the libraries an embedding depends on, recorded in the folder (what computed its rows)."""
    import av  # noqa: PLC0415 (optional)
    import torch  # noqa: PLC0415 (heavy)

    return {"coclr": __version__, "torch": torch.__version__, "av": av.__version__, "opencv": cv2.__version__,
            "numpy": numpy.__version__}


def embedder_for(root: str | Path, device: str | None = None, **options: Any) -> Embedder:
    """An :class:`Embedder` with the settings and checkpoints an output folder recorded (to embed a query video
    the way the folder's videos were); the checkpoint files must still hold the recorded content."""

    record = read_settings(root)
    paths = {}
    for name in CHECKPOINTS:
        info = record.get(name)
        if info is None:
            paths[name] = None
            continue
        path = Path(info["path"])
        if not path.is_file():
            raise CheckpointError(f"{root} was embedded with {path}, which no longer exists")
        if checkpoint_sha256(path) != info["sha256"]:
            raise CheckpointError(f"{path} has changed since {root} was embedded with it (sha256 differs)")
        paths[name] = path
    settings = {key: value for key, value in record["settings"].items() if not key.endswith("_sha256")}
    return Embedder(paths["checkpoint"], device=device, flow_checkpoint=paths["flow_checkpoint"], **options,
                    **settings)


def embed_videos(inputs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], embedder: Embedder,
                 progress: bool = True, retry_failed: bool = False, flush_videos: int = EmbedJob.flush_every,
                 flush_seconds: float = 60.0,
                 streams: dict[int, tuple[str | os.PathLike[str], Embedder]] | None = None) -> EmbedSummary:
    """Embed the videos named by ``inputs`` (:func:`~coclr.embed.inputs.expand_inputs`) into the output folder
    ``out`` (:mod:`coclr.embed.output`): videos already there unchanged are skipped, so the same command
    continues after an interruption; a folder made with other settings is refused before any work. Unreadable
    videos are counted, listed in ``failed.jsonl`` (an earlier row of theirs dropped) and skipped by later runs
    while unchanged (unless ``retry_failed``). Rows of files removed or changed since they were embedded, and
    not embedded again by this run, are dropped.

    ``streams`` (stream index -> (folder, an embedder of that stream alone)): the same pass also writes each
    stream's own embedding into its folder, recorded as that embedder's (whose settings must give the same
    windows), so a two-stream pass writes the flow stream's folder without computing flow twice.

    In a distributed job (a ``torch.distributed`` group, e.g. under torchrun) rank 0 holds the folder and
    decides what to do, each process embeds every ``world_size``-th video of it (as ``coclr flow`` shares
    entries), and rank 0 merges all results: the folder is the one a single process writes."""
    started = time.perf_counter()
    summary = EmbedSummary(Path(out), world=world_size())
    unusable: dict[str, str] = {}
    paths = [str(path) for path in expand_inputs(inputs, summary.notes, unusable)]
    outputs = [(out, folder_record(embedder), None)]
    for index, (folder, alone) in (streams or {}).items():
        check_stream_alone(embedder, index, alone)
        outputs.append((folder, folder_record(alone), index))
    with contextlib.ExitStack() as stack:
        if embedder.device.type == "cpu":  # each batch's activations reuse the memory of the last batch's
            stack.enter_context(freed_memory_reused())
        writers = [stack.enter_context(job_writer(folder, record, flush_videos, flush_seconds))
                   for folder, record, _ in outputs]
        plan = None
        failed: list[tuple[int, str, str]] = []
        if isinstance(writers[0], EmbeddingWriter):  # rank 0, or the only process
            paths = known_names(paths, writers[0].done, summary.notes)
            identities = {path: file_identity(path) for path in paths}
            todos = []
            for number, writer in enumerate(writers):
                writer.place(paths)
                todo = [order for order, path in enumerate(paths) if writer.todo(path, identities[path], retry_failed)]
                # An input that is neither a video nor a list fails as a video does (listed, skipped while unchanged).
                bad = [path for path in unusable if writer.todo(path, file_identity(path), retry_failed)]
                stale = writer.stale({paths[order] for order in todo} | set(bad))
                for path, reason in stale.items():
                    writer.add_stale(path, reason)
                for path in bad:
                    message = f"{path}: {unusable[path]}"
                    writer.add_failure(path, file_identity(path), message)
                    if number == 0:
                        failed.append((-1, path, message))
                todos.append(todo)
                if number == 0:
                    dropped, skipped_bad = stale, len(unusable) - len(bad)
                    before = [(path, writer.failed_before(path, identity)) for path, identity in
                              [*identities.items(), *((path, file_identity(path)) for path in unusable)]]
                    before = [(path, error) for path, error in before if error is not None and not retry_failed]
            plan = (paths, identities, todos, dropped, skipped_bad, before)
        paths, identities, todos, stale, skipped_bad, before = broadcast_object(plan)  # rank 0's, for every rank
        wanted = [set(todo) for todo in todos]
        todo = sorted(set().union(*wanted))
        summary.skipped, summary.dropped = len(paths) - len(todo) + skipped_bad, stale
        doing = {paths[order] for order in todo}  # (a stream's own folder may want a video the first does not)
        summary.failed_before = [(path, error) for path, error in before if path not in doing]
        mine = shard(todo)
        damaged: list[tuple[int, str, int]] = []
        try:
            for index, result in embedder.stream([paths[order] for order in mine], progress=progress and rank() == 0,
                                                 desc=f"embedding -> {out}"):
                order = mine[index]
                path = paths[order]
                if isinstance(result, EmbedFailure):
                    failed.append((order, path, result.error))
                else:
                    summary.done += 1
                    summary.windows += len(result.windows)
                    if result.damaged_frames:
                        damaged.append((order, path, result.damaged_frames))
                for writer, (_, _, part), todo_of in zip(writers, outputs, wanted):
                    if order not in todo_of:
                        continue
                    if isinstance(result, EmbedFailure):
                        writer.add_failure(path, identities[path], result.error)
                    else:
                        writer.add(result if part is None else result.stream(part), identities[path], order)
        except KeyboardInterrupt as error:  # the writers keep what is done (flushed; merged by the next run)
            kept = (f"{summary.skipped + summary.done} of {len(paths)} videos embedded and kept" if not is_distributed()
                    else f"{summary.done} videos embedded by this process (rank {rank()}) kept")
            raise interrupted(error, f"{out}: {kept}") from None
        counts = all_gather_objects((summary.done, summary.windows, failed, damaged))
    summary.done, summary.windows = sum(c[0] for c in counts), sum(c[1] for c in counts)
    summary.failed = [(path, error) for _, path, error in sorted(f for c in counts for f in c[2])]
    summary.damaged = [(path, count) for _, path, count in sorted(d for c in counts for d in c[3])]
    summary.seconds = time.perf_counter() - started
    return summary


def check_stream_alone(embedder: Embedder, index: int, alone: Embedder) -> None:
    """Refuse to record stream ``index`` of ``embedder`` as ``alone``'s embedding unless ``alone`` embeds that stream
    by itself with the same windows, crops and normalisation."""
    if len(embedder.streams) < 2 or not 0 <= index < len(embedder.streams):
        raise ConfigError(f"stream {index}: the embedder has {len(embedder.streams)} stream(s); a stream alone is "
                          "written from a pass of several")
    view = embedder.streams[index].view
    keys = ("length", "stride", "size", "fps", "short_side", "window_step", "feature", "precision", "flow_bound")
    keys += ("flow_mean", "flow_std") if view == "flow" else ("mean", "std")
    differ = [key for key in keys if getattr(embedder.settings, key) != getattr(alone.settings, key)]
    if len(alone.streams) != 1 or alone.streams[0].view != view or differ:
        raise ConfigError(f"stream {index} ({view}) cannot be recorded as {alone.checkpoint}'s embedding: "
                          f"{', '.join(differ) or 'another view'} differ(s)")


@contextlib.contextmanager
def job_writer(out: str | os.PathLike[str], record: dict[str, Any], flush_videos: int,
               flush_seconds: float) -> Iterator[ChunkWriter]:
    """The writer of this process: the :class:`EmbeddingWriter` of ``out`` (lock, checks, merge) in one process
    and on rank 0 of a distributed job; a :class:`ChunkWriter` into the same folder on the other ranks, which wait
    for rank 0 to hold the folder (or raise the error that refused it). Every rank flushes before rank 0 merges."""
    if not is_distributed():
        with EmbeddingWriter(out, record, flush_videos, flush_seconds) as writer:
            yield writer
        return
    with contextlib.ExitStack() as stack:
        error, writer = None, None
        if rank() == 0:
            try:
                writer = stack.enter_context(EmbeddingWriter(out, record, flush_videos, flush_seconds))
            except CoclrError as refused:
                error = refused
        message = broadcast_object(None if error is None else str(error))
        if error is not None:
            raise error
        if message is not None:
            raise DataError(message)
        writer = writer or ChunkWriter(out, record, flush_videos, flush_seconds, name=f"-rank{rank()}")
        try:
            yield writer
        except KeyboardInterrupt:  # stopped: what this process finished is kept too, for the next run to merge
            writer.flush()
            raise
        writer.flush()
        barrier()  # every rank's chunks are on disk before rank 0 merges them (on leaving the stack)
