"""``coclr embed`` as a library function: expand the inputs, skip what the folder has, embed the rest into it."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from coclr.embed.embedder import Embedder, EmbedFailure
from coclr.embed.inputs import expand_inputs
from coclr.embed.output import EmbeddingWriter, file_identity, read_settings
from coclr.errors import CheckpointError


@dataclasses.dataclass
class EmbedSummary:
    """What a run did: videos embedded, skipped (already in the folder, or failed before unchanged), failed
    (path, message), windows embedded, and the wall-clock seconds."""

    out: Path
    done: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    windows: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        rate = self.done / self.seconds if self.seconds > 0 else 0.0
        window_rate = self.windows / self.seconds if self.seconds > 0 else 0.0
        lines = [f"{self.out}: {self.done} videos embedded ({self.windows} windows), {self.skipped} skipped (already "
                 f"there, or failed before and unchanged), {len(self.failed)} failed; {self.seconds:.1f} s "
                 f"({rate:.2f} videos/s, {window_rate:.1f} windows/s)"]
        shown = self.failed[:20]
        lines += [f"  failed: {message}" for _, message in shown]
        if len(self.failed) > len(shown):
            lines.append(f"  ... and {len(self.failed) - len(shown)} more, listed in {self.out / 'failed.jsonl'}")
        return "\n".join(lines)


def folder_record(embedder: Embedder) -> dict[str, Any]:
    """What ``embed.json`` records: the settings (with the checkpoints' content hashes, which a rerun must
    match), the checkpoint files, the dimension and the library versions."""
    from coclr.eval.features import file_sha256
    from coclr.models.loading import checkpoint_format

    checkpoints = {"checkpoint": embedder.checkpoint, "flow_checkpoint": embedder.flow_checkpoint}
    described = {name: None if path is None else {"path": os.path.abspath(path), "sha256": file_sha256(path),
                                                   "format": checkpoint_format(path)}
                 for name, path in checkpoints.items()}
    settings = embedder.settings.to_dict()
    settings.update({f"{name}_sha256": None if info is None else info["sha256"] for name, info in described.items()})
    return {"settings": settings, **described, "dim": embedder.dim, "versions": library_versions()}


def library_versions() -> dict[str, str]:
    import av
    import cv2
    import numpy
    import torch

    import coclr

    return {"coclr": coclr.__version__, "torch": torch.__version__, "av": av.__version__, "opencv": cv2.__version__,
            "numpy": numpy.__version__}


def embedder_for(root: str | Path, device: str | None = None, **options: Any) -> Embedder:
    """An :class:`Embedder` with the settings and checkpoints an output folder recorded (to embed a query video
    the way the folder's videos were); the checkpoint files must still hold the recorded content."""
    from coclr.eval.features import file_sha256

    record = read_settings(root)
    paths = {}
    for name in ("checkpoint", "flow_checkpoint"):
        info = record.get(name)
        if info is None:
            paths[name] = None
            continue
        path = Path(info["path"])
        if not path.is_file():
            raise CheckpointError(f"{root} was embedded with {path}, which no longer exists")
        if file_sha256(path) != info["sha256"]:
            raise CheckpointError(f"{path} has changed since {root} was embedded with it (sha256 differs)")
        paths[name] = path
    settings = {key: value for key, value in record["settings"].items() if not key.endswith("_sha256")}
    return Embedder(paths["checkpoint"], device=device, flow_checkpoint=paths["flow_checkpoint"], **options,
                    **settings)


def embed_videos(inputs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], embedder: Embedder,
                 progress: bool = True, retry_failed: bool = False, flush_videos: int = 256,
                 flush_seconds: float = 60.0) -> EmbedSummary:
    """Embed the videos named by ``inputs`` (:func:`~coclr.embed.inputs.expand_inputs`) into the output folder
    ``out`` (:mod:`coclr.embed.output`): videos already there unchanged are skipped, so the same command
    continues after an interruption; a folder made with other settings is refused before any work. Unreadable
    videos are counted, listed in ``failed.jsonl`` and skipped by later runs while unchanged (unless
    ``retry_failed``)."""
    started = time.perf_counter()
    paths = [str(path) for path in expand_inputs(inputs)]
    summary = EmbedSummary(Path(out))
    with EmbeddingWriter(out, folder_record(embedder), flush_videos, flush_seconds) as writer:
        identities = {path: file_identity(path) for path in paths}
        todo = [path for path in paths if writer.todo(path, identities[path], retry_failed)]
        summary.skipped = len(paths) - len(todo)
        for index, result in embedder.stream(todo, progress=progress, desc=f"embedding -> {out}"):
            path = todo[index]
            if isinstance(result, EmbedFailure):
                summary.failed.append((path, result.error))
                writer.add_failure(path, identities[path], result.error)
            else:
                summary.done += 1
                summary.windows += len(result.windows)
                writer.add(result, identities[path])
    summary.seconds = time.perf_counter() - started
    return summary
