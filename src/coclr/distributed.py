"""Thin helpers over ``torch.distributed`` that are no-ops in a single process.

The rest of :mod:`coclr.core` calls these instead of ``torch.distributed`` directly, so the same code runs
in one process (CPU or one GPU) and under DDP without ``if distributed:`` branches. Every collective here
must be called by all ranks in the same order, as with ``torch.distributed`` itself.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from coclr.errors import CoclrError, ConfigError


def launched_world_size() -> int:
    """The number of processes torchrun started (``WORLD_SIZE``; 1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@contextmanager
def alone() -> Iterator[None]:
    """Work of this process alone while torchrun's other processes wait for it (learn's measurement on rank 0; also a
    decorator): nothing run meanwhile joins their group (a training run timed there did, which released the others
    into collectives that did not match, and the job hung)."""
    saved = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("WORLD_SIZE", None)
        else:
            os.environ["WORLD_SIZE"] = saved


def launched_rank() -> int:
    """This process's rank as torchrun started it (``RANK``; 0 outside torchrun), known before the group is joined."""
    return int(os.environ.get("RANK", "0"))


def launched_machines() -> int:
    """The number of machines torchrun started processes on (``WORLD_SIZE / LOCAL_WORLD_SIZE``; 1 outside it)."""
    return max(1, launched_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", launched_world_size())))


def local_device(name: str) -> str:
    """``name`` with ``cuda`` made this process's GPU under torchrun (``cuda:LOCAL_RANK``); other names as given."""
    if name == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{os.environ['LOCAL_RANK']}"
    return name


def pick_device(requested: str | torch.device | None = None, option: str = "device") -> torch.device:
    """The one device picker: ``requested`` (``None`` or ``"auto"``: CUDA when available, else the CPU), with
    ``cuda`` made this process's GPU under torchrun (:func:`local_device`). A device that does not exist here is a
    :class:`ConfigError` naming ``option`` (the command's option, e.g. ``run.device`` or ``--device``)."""
    name = str(requested) if requested is not None else "auto"
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(local_device(name))
    except (RuntimeError, ValueError):
        raise ConfigError(f"{option}: {name!r} is not a torch device (e.g. auto, cpu, cuda, cuda:1)") from None
    if device.type == "cpu" and device.index is not None:  # (torch takes "cpu:3"; a run's device option refused it)
        raise ConfigError(f"{option}: {name!r}: the CPU is one device, not numbered; give cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{option}: {name!r} was asked for but CUDA is not available")
    if not _available(device.type):
        raise ConfigError(f"{option}: {name!r} is not a device this torch can run on here (these are: cpu"
                          f"{', cuda' if torch.cuda.is_available() else ''})")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"{option}: {name!r} does not exist ({torch.cuda.device_count()} CUDA device(s))")
    return device


def _available(kind: str) -> bool:
    """Whether this torch can run on devices of ``kind`` here (the CPU always; ``meta`` holds no data, so never)."""
    if kind == "cpu":
        return True
    if kind == "mps":
        return torch.backends.mps.is_available()
    return bool(getattr(getattr(torch, kind, None), "is_available", lambda: False)())


REFUSAL_WAIT = timedelta(minutes=15)
"""How long a process of a torchrun job refused before it joined the group waits for the others to join it, to tell
them (:func:`share_refusal`): they come as soon as their own checks are through (learn's rank 0 measures first)."""


class RefusedElsewhere(CoclrError):
    """Another process of this torchrun job was refused before the job began: this one stops too, where it waited in
    the group for it (on another machine, for ever: torchrun stops the others only on the machine of the one that
    left). ``said``: whether this process says the refusal, once on each machine where no process said its own."""

    def __init__(self, line: str, said: bool) -> None:
        super().__init__(line)
        self.said = said


def _backend() -> str:
    """The process group's backends, the same on every process whatever device its command picked (a process
    refused before it picked one joins with them to say so): gloo for CPU tensors (and every object collective),
    NCCL for CUDA tensors where this torch has both."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def _join(device: torch.device | None, timeout: timedelta | None) -> None:
    """Join the process group torchrun describes (``device``: this process's GPU, for NCCL). On a GPU, collectives
    wait NCCL's default time for a lost peer (10 minutes; a group of two backends would take gloo's 30)."""
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
        if timeout is None:
            from torch.distributed.constants import default_pg_nccl_timeout  # noqa: PLC0415

            timeout = default_pg_nccl_timeout
    dist.init_process_group(_backend(), **({} if timeout is None else {"timeout": timeout}))
    atexit.register(destroy_distributed)


def _machine() -> int:
    """The machine this process runs on, numbered as torchrun numbers them (``GROUP_RANK``)."""
    return int(os.environ.get("GROUP_RANK", launched_rank() // int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))


def _refusals(line: str | None) -> list[tuple[int, str | None]]:
    """Every process's machine and refusal (None: it was not refused), in rank order: the first exchange of a job, in
    which every process has joined before any may leave (one refused at once would otherwise reset the connections of
    one still joining, which then failed with a network error)."""
    return all_gather_objects((_machine(), line))


def init_distributed(device: torch.device, timeout: timedelta | None = None) -> None:
    """Join the process group torchrun describes, and wait until every process has; nothing in one process or when
    already joined. The group is destroyed when the process exits (:func:`destroy_distributed`). A process refused
    before it joined (:func:`share_refusal`) stops every other: :class:`RefusedElsewhere`.

    ``device``: this process's device (its GPU is made current). ``timeout``: how long a collective waits for the
    other processes (when None, torch's default: gloo's 30 minutes on the CPU, NCCL's 10 on a GPU).
    """
    if launched_world_size() <= 1 or dist.is_initialized():
        return
    _join(device, timeout)
    refusals = _refusals(None)
    first = next(((number, machine, line) for number, (machine, line) in enumerate(refusals) if line is not None),
                 None)
    if first is not None:
        number, _, line = first
        said = os.environ.get("LOCAL_RANK", "0") == "0" and not any(
            machine == _machine() and refused is not None for machine, refused in refusals)
        raise RefusedElsewhere(f"process {number} of the {len(refusals)} of this torchrun job was refused, so "
                               f"none starts: {line}", said)


def share_refusal(line: str) -> None:
    """Under torchrun, in a process refused before it joined the process group (``line``: what it said): join the
    group for a moment to tell the others, which otherwise waited for it in :func:`init_distributed` until the
    group's timeout (on another machine than this one: torchrun stops its other processes only on the machine where
    one left). Nothing in one process, when joined already, or when the others do not come within
    :data:`REFUSAL_WAIT` (or this process is stopped meanwhile)."""
    if launched_world_size() <= 1 or dist.is_initialized():
        return
    sys.stderr.flush()
    saved, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)  # (the group's own lines, e.g. c10d's when the others do not come, after this one's refusal)
    try:
        _join(None, REFUSAL_WAIT)
        _refusals(line)
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 (a process that cannot tell them has said its line)
        return
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)


def lost_process_line(error: BaseException) -> str | None:
    """Under torchrun, one line for a collective that failed because another process of the job stopped or lost its
    connection (killed, out of memory, its machine gone): gloo's and NCCL's errors name a transport and the peer, in
    a traceback of 80 lines that says nothing of what to do. None for any other error, or outside torchrun."""
    if launched_world_size() <= 1 or not isinstance(error, RuntimeError):
        return None
    text = " ".join(str(error).split())
    if not isinstance(error, dist.DistError) and not any(mark in text for mark in ("gloo", "NCCL", "c10d")):
        return None
    cause = text.split("] ", 1)[-1].split(". ", 1)[0].rstrip(".")  # "Read error [host]:port: Connection reset..."
    return (f"another process of this torchrun job stopped or lost its connection ({cause}); what was written is "
            "kept: run the same torchrun command to continue (its own output says why it stopped)")


def destroy_distributed() -> None:
    """Leave and destroy the default process group, if any (registered at exit by :func:`init_distributed`: a
    group left to the interpreter's teardown can hang NCCL's communicators or leak their resources)."""
    if is_distributed():
        dist.destroy_process_group()


def is_distributed() -> bool:
    """True when a ``torch.distributed`` process group is initialised (then collectives communicate)."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    """Number of processes in the default group (1 when not distributed)."""
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """This process's rank in the default group (0 when not distributed)."""
    return dist.get_rank() if is_distributed() else 0


def is_main() -> bool:
    """True on rank 0, the process that writes files and logs."""
    return rank() == 0


def _gather_sizes(length: int, device: torch.device) -> list[int]:
    """Every rank's ``length``, in rank order."""
    mine = torch.tensor([length], dtype=torch.long, device=device)
    sizes = [torch.empty_like(mine) for _ in range(world_size())]
    dist.all_gather(sizes, mine)
    return [int(size) for size in sizes]


@torch.no_grad()
def all_gather_sizes_concat(t: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """:func:`all_gather_concat` that also returns every rank's number of rows, in rank order."""
    if not is_distributed():
        return t.detach(), [t.shape[0]]
    sizes = _gather_sizes(t.shape[0], t.device)
    # Collectives cannot move bool on every backend; move it as uint8.
    payload = t.detach().contiguous()
    payload = payload.to(torch.uint8) if t.dtype == torch.bool else payload
    longest = max(sizes)
    if payload.shape[0] < longest:  # all_gather needs equal shapes: pad, then trim
        padding = payload.new_zeros((longest - payload.shape[0], *payload.shape[1:]))
        payload = torch.cat([payload, padding])
    parts = [torch.empty_like(payload) for _ in sizes]
    dist.all_gather(parts, payload)
    gathered = torch.cat([part[:size] for part, size in zip(parts, sizes)])
    return gathered.to(t.dtype), sizes


def all_gather_concat(t: torch.Tensor) -> torch.Tensor:
    """Concatenate ``t`` from every rank along dim 0, in rank order; ``t`` itself when not distributed.

    Ranks may hold different numbers of rows (the other dimensions must agree). The result carries no
    gradient: it is used for keys and queue entries, which are targets, never optimised through.
    """
    return all_gather_sizes_concat(t)[0]


def mean_where_defined(values: torch.Tensor) -> torch.Tensor:
    """Each value's mean over the processes where it is finite (NaN where it is on none): a statistic undefined on
    one process at a step (nothing to score there) leaves the others' mean, where a plain all-reduce made it NaN."""
    defined = torch.isfinite(values)
    both = torch.cat([torch.where(defined, values, torch.zeros_like(values)), defined.to(values.dtype)])
    if is_distributed():
        dist.all_reduce(both)
    total, count = both.chunk(2)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


def barrier() -> None:
    """Wait until every rank has reached this call (no-op when not distributed)."""
    if is_distributed():
        dist.barrier()


@contextmanager
def held_by_main(enter: Callable[[], AbstractContextManager[Any]]) -> Iterator[None]:
    """Hold the context ``enter()`` (a folder's or a view's lock) for every rank of a job: rank 0 enters it, and a
    refusal (a :class:`~coclr.errors.CoclrError`) is raised on every rank, so that no process waits for a rank
    that stopped; rank 0 keeps it until every rank is through. In one process: ``enter()`` itself."""
    if not is_distributed():
        with enter():
            yield
        return
    with ExitStack() as stack:
        refused = None
        if is_main():
            try:
                stack.enter_context(enter())
            except CoclrError as error:
                refused = error
        shared = broadcast_object(refused)
        if shared is not None:
            raise refused if refused is not None else shared
        yield
        barrier()  # reached on success only: a rank that raised ends its process, and torchrun stops the others


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order (``[obj]`` when not distributed)."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (``obj`` itself when not distributed)."""
    if not is_distributed():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


@torch.no_grad()
def broadcast_(t: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite ``t`` in place with rank ``src``'s values (no-op when not distributed); returns ``t``."""
    if is_distributed():
        dist.broadcast(t, src=src)
    return t
