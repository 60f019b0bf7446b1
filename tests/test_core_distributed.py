"""The distributed helpers, the queue and shuffle-BN in a real 2-process gloo group (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from coclr import distributed
from coclr.core.momentum import shuffled_forward
from coclr.core.queue import MomentumQueue

WORLD = 2
QUEUE_SIZE = 7  # not a multiple of the global batch
STEPS = 3


def rank_batch(rank: int, step: int) -> dict[str, torch.Tensor]:
    """A batch whose values say which rank and step produced them; ranks have different sizes."""
    rows = 2 + rank
    ids = torch.tensor([100 * rank + 10 * step + i for i in range(rows)])
    return {
        "keys": ids[:, None].float().repeat(1, 3),
        "labels": ids % 5,
        "video_ids": ids,
        "groups": ids // 3,
        "other": -ids[:, None].float().repeat(1, 2),
    }


class TagRank(nn.Module):
    """A per-sample function that also records which rank computed each row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tag = torch.full((x.shape[0], 1), float(dist.get_rank()))
        return torch.cat([x * 3 + 1, tag], dim=1)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        results: dict[str, object] = {
            "world_size": distributed.world_size(),
            "rank": distributed.rank(),
            "is_main": distributed.is_main(),
            "gathered": distributed.all_gather_concat(torch.full((rank + 1, 2), rank, dtype=torch.long)),
            "gathered_bool": distributed.all_gather_concat(torch.tensor([rank == 0, True])),
            "broadcast": distributed.broadcast_(torch.tensor([float(rank + 5)]), src=1),
            # a statistic defined on one process only (NaN on the other) is that one's, not NaN
            "mean_defined": distributed.mean_where_defined(
                torch.tensor([float(rank), float("nan") if rank else 0.5, float("nan")])),
        }
        queue = MomentumQueue(QUEUE_SIZE, 3, other_dim=2, generator=torch.Generator().manual_seed(0))
        for step in range(STEPS):
            queue.enqueue(**rank_batch(rank, step))
        results["queue"] = queue.state_dict()

        outputs = []
        for call in range(3):
            x = torch.randn(3 + 2 * rank, 4, generator=torch.Generator().manual_seed(10 * rank + call))
            outputs.append((x, shuffled_forward(TagRank(), x, generator=torch.Generator().manual_seed(call))))
        results["shuffled"] = outputs
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_process_gloo(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]

    for rank, result in enumerate(results):
        assert (result["world_size"], result["rank"], result["is_main"]) == (WORLD, rank, rank == 0)
        assert result["gathered"][:, 0].tolist() == [0, 1, 1]  # rank order, unequal sizes
        assert result["gathered_bool"].tolist() == [True, True, False, True]
        assert result["broadcast"].tolist() == [6.0]
        assert result["mean_defined"][:2].tolist() == [0.5, 0.5] and result["mean_defined"][2].isnan()

    # Both ranks hold the same queue, equal to one process fed the global batches in rank order.
    reference = MomentumQueue(QUEUE_SIZE, 3, other_dim=2, generator=torch.Generator().manual_seed(0))
    for step in range(STEPS):
        parts = [rank_batch(r, step) for r in range(WORLD)]
        reference.enqueue(**{name: torch.cat([part[name] for part in parts]) for name in parts[0]})
    for name, value in reference.state_dict().items():
        assert torch.equal(results[0]["queue"][name], value), name
        assert torch.equal(results[1]["queue"][name], value), name
    # The last global batch (ids 2x, 12x of step 2) is in the queue: keys of both ranks, rank 0 first.
    ids = results[0]["queue"]["video_ids"].tolist()
    assert [ids.index(i) for i in (20, 21, 120, 121, 122)] == [(10 + k) % QUEUE_SIZE for k in range(5)]
    assert bool(results[0]["queue"]["full"])

    # shuffled_forward returns each rank's own rows, and rows were computed on both ranks (a real shuffle).
    computed_elsewhere = 0
    for rank, result in enumerate(results):
        for x, out in result["shuffled"]:
            torch.testing.assert_close(out[:, :4], x * 3 + 1)
            computed_elsewhere += int((out[:, 4] != rank).sum())
    assert computed_elsewhere > 0


def test_single_process_helpers_are_identity():
    assert not distributed.is_distributed()
    assert (distributed.world_size(), distributed.rank(), distributed.is_main()) == (1, 0, True)
    t = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(distributed.all_gather_concat(t), t)
    assert torch.equal(distributed.broadcast_(t.clone(), src=0), t)


GROUP_AT_EXIT = """
import atexit, os, sys
import pytest
import torch
import torch.distributed as dist
from coclr.distributed import init_distributed

out = sys.argv[1]
# registered before the group exists, so it runs after init_distributed's own exit handler (last in, first out)
atexit.register(lambda: open(out, "w").write(str(dist.is_initialized())))
init_distributed(torch.device("cpu"))
assert dist.is_initialized() and dist.get_world_size() == 2
"""


def test_the_process_group_is_destroyed_when_the_process_exits(tmp_path):
    """Two processes join through init_distributed (as torchrun starts them) and exit without cleaning up: their
    group is gone before the interpreter's teardown."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    src = Path(distributed.__file__).resolve().parents[2]
    processes = []
    for rank in range(WORLD):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
        processes.append(subprocess.Popen([sys.executable, "-c", GROUP_AT_EXIT, str(tmp_path / f"rank{rank}")],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    assert [(tmp_path / f"rank{rank}").read_text() for rank in range(WORLD)] == ["False", "False"]


def test_a_collective_failed_by_a_lost_process_is_one_line(monkeypatch, capsys) -> None:
    """Under torchrun, a gloo or NCCL error of a peer gone is one line and status 2; other errors are left alone."""
    import argparse

    import torch.distributed  # noqa: F401 (loaded, as in any command that joined a group)

    from coclr.cli._world import WORLD_ERROR_STATUS, run_command

    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                        "[127.0.0.1]:26322: Connection reset by peer. This is typically caused by a remote worker "
                        "hanging or bugs in the application.")

    def raising(error: BaseException):
        def func(args) -> int:
            raise error
        return argparse.Namespace(command="pretrain", func=func)

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_command(raising(gloo)) == WORLD_ERROR_STATUS
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["coclr pretrain: error: another process of this torchrun job stopped or lost its connection "
                     "(Read error [127.0.0.1]:26322: Connection reset by peer); what was written is kept: run the "
                     "same torchrun command to continue (its own output says why it stopped)"]
    with pytest.raises(RuntimeError, match="shapes"):
        run_command(raising(RuntimeError("mat1 and mat2 shapes cannot be multiplied")))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match="gloo"):
        run_command(raising(gloo))


def test_an_allocation_the_machine_cannot_make_is_one_line(capsys) -> None:
    """`model.embed_dim=99999999999` ended in the allocator's traceback."""
    import argparse

    from coclr.cli._world import WORLD_ERROR_STATUS, run_command

    def allocate(args) -> int:
        torch.empty(2 ** 62, dtype=torch.uint8)
        return 0

    assert run_command(argparse.Namespace(command="pretrain", func=allocate)) == WORLD_ERROR_STATUS
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("coclr pretrain: error: not enough memory for 4611686018427387904")
    assert "give smaller sizes" in lines[0]


class _KilledInWorker(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a worker
        return index


def test_a_killed_data_worker_and_too_few_file_descriptors_are_one_line(capsys) -> None:
    """A DataLoader worker killed mid-run (the out-of-memory killer's way), and too many open files, were
    tracebacks."""
    import argparse
    import errno

    from coclr.cli._world import WORLD_ERROR_STATUS, run_command

    def load(args) -> int:
        list(torch.utils.data.DataLoader(_KilledInWorker(), num_workers=1))
        return 0

    def files(args) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    def torch_files(args) -> int:
        raise RuntimeError("Too many open files. Communication with the workers is no longer possible. Please "
                           "increase the limit using `ulimit -n` in the shell")

    for run, words in ((load, "a data-loading worker process was killed"), (files, "raise the limit (ulimit -n)"),
                       (torch_files, "raise the limit (ulimit -n)")):
        assert run_command(argparse.Namespace(command="pretrain", func=run)) == WORLD_ERROR_STATUS
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("coclr pretrain: error: ") and words in lines[0], lines
