"""`torchrun -m coclr flow` on 2 CPU processes (gloo): the store one process writes, each entry computed by exactly
one process; a process killed mid-run, then the same command, completes it; one job per view, all ranks admitted."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from coclr.errors import DataError
from coclr.store.clipstore import ClipStore
from coclr.store.flow_extract import extract_flow
from test_flow_extract import make_store, moving_texture
from test_train_distributed import free_port

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = ["nscales=2", "warps=1", "outer_iterations=2", "inner_iterations=10"]


def torchrun(store: Path, *extra: str, processes: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", "-m",
            "coclr", "flow", str(store), "--backend", "tvl1-torch", "--device", "cpu", "--workers", "1",
            "--batch-pairs", "4", *extra]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}


def stored_bytes(root: Path, view: str) -> dict[str, list[bytes]]:
    store = ClipStore(root)
    return {key: store.read_encoded(key, view, range(store.num_frames(key, view))) for key in store.keys()
            if store.has(key, view)}


@pytest.mark.slow
def test_two_processes_write_the_store_of_one_process(tmp_path):
    videos = {f"v{i}.avi": moving_texture(2 + i % 4, 1, i % 3 - 1, seed=i) for i in range(9)}
    videos["single_frame.avi"] = moving_texture(1, 0, 0)
    make_store(tmp_path / "two", videos)
    shutil.copytree(tmp_path / "two", tmp_path / "one")
    result = subprocess.run(torchrun(tmp_path / "two", *OVERRIDES), env=environment(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr  # single_frame.avi failed, in one of the two
    keys = ClipStore(tmp_path / "two").keys()
    for rank in range(2):
        share = keys[rank::2]
        done = len([key for key in share if key != "single_frame.avi"])
        assert f"[rank {rank} of 2] flow: {done} done, 0 skipped" in result.stdout, result.stdout
    assert "all 2 processes: 9 done, 0 skipped, 1 failed" in result.stdout

    single = extract_flow(tmp_path / "one", backend="tvl1-torch", device="cpu", workers=1, batch_pairs=4,
                          params=_params())
    assert single.done == 9
    two, one = stored_bytes(tmp_path / "two", "flow"), stored_bytes(tmp_path / "one", "flow")
    assert len(two) == 9 and two == one
    assert ClipStore(tmp_path / "two").failed("flow").keys() == ClipStore(tmp_path / "one").failed("flow").keys() \
        == {"single_frame.avi"}
    assert ClipStore(tmp_path / "two").meta["flow_method"] == ClipStore(tmp_path / "one").meta["flow_method"]


def _params():
    from coclr.config import load_config
    from coclr.flow.params import TVL1Params

    return load_config(TVL1Params, None, OVERRIDES)


def _rank_process(agent: int, rank: int) -> int | None:
    """The pid of torchrun worker ``rank`` among the children of the torchrun process ``agent``."""
    for child in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(child)
    return None


@pytest.mark.slow
def test_a_process_killed_mid_run_then_the_same_command_completes_the_store(tmp_path):
    # 30 frames per video: each entry takes a few tenths of a second, so that after the first entries of both
    # processes the others still have several to go when the kill lands (with 5 frames all ten were written within
    # 0.2 s, and the kill sometimes came after the last)
    videos = {f"v{i:02d}.avi": moving_texture(30, 1 + i % 2, i % 3 - 1, seed=i) for i in range(10)}
    make_store(tmp_path / "two", videos)
    shutil.copytree(tmp_path / "two", tmp_path / "one")
    heavier = ["nscales=3", "warps=3"]
    command = torchrun(tmp_path / "two", "--kernels", "torch", *heavier)
    agent = subprocess.Popen(command, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    flow_dir = tmp_path / "two" / "flow"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and agent.poll() is None:
            if flow_dir.is_dir() and len(list(flow_dir.rglob("*.frames"))) >= 2:
                break
            time.sleep(0.05)
        victim = _rank_process(agent.pid, 1)
        assert agent.poll() is None and victim is not None, "the run ended before a process could be killed"
        os.kill(victim, signal.SIGKILL)
        agent.wait(timeout=120)  # torchrun stops the other process and fails
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    written = len(list(flow_dir.rglob("*.frames")))
    assert agent.returncode != 0 and 2 <= written < len(videos), (agent.returncode, written)

    resumed = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"all 2 processes: {len(videos) - written} done, {written} skipped, 0 failed" in resumed.stdout
    from coclr.config import load_config
    from coclr.flow.params import TVL1Params

    extract_flow(tmp_path / "one", backend="tvl1-torch", device="cpu", workers=1, batch_pairs=4,
                 params=load_config(TVL1Params, None, heavier), kernels="torch")
    assert stored_bytes(tmp_path / "two", "flow") == stored_bytes(tmp_path / "one", "flow")
    assert not list(flow_dir.rglob("*partial*"))


def _wait_for(path: Path, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.exists()


def _lock_worker(rank: int, port: int, root: str, signals: str) -> None:
    """Rank ``rank`` of a 2-process job: tries the view while another job holds it, then, told to, takes it."""
    import torch.distributed as dist

    from coclr.store.jobs import job_view_lock

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo")
    folder = Path(signals)
    try:
        with job_view_lock(root, "flow"):
            (folder / f"early{rank}").touch()
    except DataError as error:  # (whole when it appears: the test reads it as soon as it exists)
        (folder / f"refused{rank}.part").write_text(str(error))
        os.replace(folder / f"refused{rank}.part", folder / f"refused{rank}")
    _wait_for(folder / "go")
    with job_view_lock(root, "flow"):
        (folder / f"inside{rank}").touch()
        _wait_for(folder / "release", 60)
    dist.destroy_process_group()


def test_one_job_per_view_admits_all_ranks_of_a_distributed_job(tmp_path):
    from coclr.store.jobs import view_lock

    make_store(tmp_path / "store", {"a.avi": moving_texture(2, 1, 0)})
    root, signals = str(tmp_path / "store"), tmp_path / "signals"
    signals.mkdir()
    with view_lock(root, "flow"):  # another job holds the view: both ranks are refused, with its message
        job = mp.start_processes(_lock_worker, args=(free_port(), root, str(signals)), nprocs=2, join=False,
                                 start_method="spawn")
        assert all(_wait_for(signals / f"refused{r}") for r in range(2))
    messages = [(signals / f"refused{r}").read_text() for r in range(2)]
    assert messages[0] == messages[1] and "is being written by another job" in messages[0]
    assert not any((signals / f"early{r}").exists() for r in range(2))
    (signals / "go").touch()  # now the distributed job holds the view: both ranks are in, another job is refused
    assert all(_wait_for(signals / f"inside{r}") for r in range(2))
    with pytest.raises(DataError, match="rank 0 of a distributed job of 2 processes"):
        with view_lock(root, "flow"):
            pass
    (signals / "release").touch()
    job.join()
    with view_lock(root, "flow"):  # released when the job ended
        pass
