"""Two CPU processes (gloo) train like one process with the same global batch, and share one queue."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import make_random_store
from test_train import tiny_config

STEPS = 3
OPTIONS = ("run.freeze_bn=true", f"run.max_steps={STEPS}", "optim.epochs=1", "run.save_every=0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def learner_state(trainer) -> dict[str, torch.Tensor]:
    learner = trainer.model.learners["rgb"]
    return {**{f"queue.{k}": v for k, v in learner.queue.state_dict().items()},
            **{f"encoder.{k}": v for k, v in learner.encoder_q.state_dict().items()}}


def _worker(rank: int, world: int, port: int, store: str, out: str, results: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from coclr.train.run import start_run

    with start_run(tiny_config(Path(store), Path(out), "run.batch_size=2", *OPTIONS)) as trainer:
        trainer.run()
    torch.save(learner_state(trainer), Path(results) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_two_gloo_processes_match_one_process(tmp_path: Path, start_trainer) -> None:
    store = make_random_store(tmp_path / "store", videos=16)
    results = tmp_path / "results"
    results.mkdir()
    mp.spawn(_worker, args=(2, free_port(), str(store), str(tmp_path / "ddp"), str(results)), nprocs=2, join=True)
    ranks = [torch.load(results / f"rank{r}.pt", weights_only=True) for r in range(2)]

    single = start_trainer(tiny_config(store, tmp_path / "single", "run.batch_size=4", *OPTIONS))
    single.run()
    reference = learner_state(single)

    # Both ranks hold the same queue, gathered from both ranks' samples, as one process with the global batch.
    for name in ranks[0]:
        if name.startswith("queue."):
            assert torch.equal(ranks[0][name], ranks[1][name]), name
    assert torch.equal(ranks[0]["queue.video_ids"], reference["queue.video_ids"])
    seen = set(ranks[0]["queue.video_ids"].tolist())
    order = list(single.data_order.__class__(16, 2, seed=0, rank=1, world_size=2))[: 2 * STEPS]
    assert seen & set(order), "the queue holds none of rank 1's samples"
    torch.testing.assert_close(ranks[0]["queue.keys"], reference["queue.keys"], atol=1e-5, rtol=1e-4)

    # Losses and updated weights match within float tolerance.
    def losses(run: Path) -> list[float]:
        lines = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        return [line["loss"] for line in lines if "loss" in line]

    assert len(losses(tmp_path / "ddp")) == STEPS
    torch.testing.assert_close(torch.tensor(losses(tmp_path / "ddp")), torch.tensor(losses(tmp_path / "single")),
                               atol=1e-4, rtol=1e-4)
    # Adam divides by the gradients' running RMS, which amplifies float noise on weights whose gradient is
    # near zero; so the updates are compared as a whole, relative to their size, and each within one lr step.
    initial = learner_state(start_trainer(tiny_config(store, tmp_path / "init", "run.batch_size=4", *OPTIONS)))
    weights = [name for name, value in reference.items() if name.startswith("encoder.") and value.is_floating_point()]
    difference = sum(((ranks[0][n] - reference[n]) ** 2).sum() for n in weights).sqrt()
    update = sum(((reference[n] - initial[n]) ** 2).sum() for n in weights).sqrt()
    assert update > 0 and difference / update < 1e-2, (float(difference), float(update))
    for name in weights:
        torch.testing.assert_close(ranks[0][name], reference[name], atol=1e-3, rtol=0, msg=name)
        assert torch.equal(ranks[0][name], ranks[1][name]), name


@pytest.mark.slow
def test_a_two_process_run_resumes_in_one_process(tmp_path: Path, start_trainer) -> None:
    from coclr.train.checkpoint import load_checkpoint
    store = make_random_store(tmp_path / "store", videos=16)
    results = tmp_path / "results"
    results.mkdir()
    mp.spawn(_worker, args=(2, free_port(), str(store), str(tmp_path / "ddp"), str(results)), nprocs=2, join=True)
    stopped = load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pth")
    assert stopped["world_size"] == 2 and stopped["position"]["consumed"] == 4 * STEPS
    assert stopped["position"]["steps"] == STEPS and stopped["position"]["loss_sum"] > 0  # the processes' mean
    resumed = start_trainer(tiny_config(store, tmp_path / "ddp", "run.batch_size=4", "run.freeze_bn=true",
                                        "optim.epochs=1"))
    assert resumed.position.consumed == 4 * STEPS
    resumed.run()
    final = load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pth")["position"]
    assert final == {"epoch": 1, "consumed": 0, "global_step": STEPS + 1, "loss_sum": 0.0, "steps": 0,
                     "seconds": 0.0, "first_step": 0}  # the epoch ended: nothing of it held


def _refused_worker(rank: int, port: int, store: str, out: str, results: str, restart: bool = False) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from coclr.errors import CoclrError
    from coclr.train.run import start_run

    try:
        with start_run(tiny_config(Path(store), Path(out), "run.batch_size=2", *OPTIONS), restart) as trainer:
            trainer.run()
    except CoclrError as error:
        (Path(results) / f"refused{rank}").write_text(str(error))
    os._exit(0)  # not the group's teardown: once one rank has left, gloo may abort the other's (not under test)


def ended_in_time(context, seconds: float = 120) -> bool:
    """Whether every process of ``context`` (``mp.start_processes``) ended within ``seconds``; any left is killed."""
    deadline = time.monotonic() + seconds
    while not context.join(timeout=1) and time.monotonic() < deadline:
        pass
    alive = [process.pid for process in context.processes if process.is_alive()]
    for process in context.processes:
        process.kill()
    return not alive


def refusals_of_every_rank(store: Path, out: Path, tmp_path: Path, restart: bool = False) -> list[str]:
    """Start a two-process run (:func:`_refused_worker`) that is refused: each rank's refusal, once every rank has
    ended (a rank still waiting for rank 0 after four minutes fails the test)."""
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    context = mp.start_processes(_refused_worker, args=(free_port(), str(store), str(out), str(results), restart),
                                 nprocs=2, join=False, start_method="spawn")
    assert ended_in_time(context, 240), "a rank was still waiting after rank 0 was refused"
    return [(results / f"refused{rank}").read_text() for rank in range(2)]


def test_a_folder_refused_on_rank_0_stops_every_rank(tmp_path: Path) -> None:
    """Another job holds the run folder: rank 0 is refused, and the other rank gets the same refusal instead of
    waiting for rank 0 forever."""
    from coclr.train.setup import claim_run_folder, setup_run

    store = make_random_store(tmp_path / "store", videos=8)
    config = tiny_config(store, tmp_path / "run", "run.batch_size=2", *OPTIONS)
    with claim_run_folder(setup_run(config).config, 2):  # the other job, with the same options
        messages = refusals_of_every_rank(store, tmp_path / "run", tmp_path)
    assert messages[0] == messages[1] and "is writing this folder" in messages[0]
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_restart_refused_stops_every_rank(tmp_path: Path) -> None:
    """--restart on a folder of the user's: every rank is refused alike (rank 0 alone was, the other waited for it
    until torchrun stopped the job)."""
    store = make_random_store(tmp_path / "store", videos=8)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    messages = refusals_of_every_rank(store, mine, tmp_path, restart=True)
    assert messages[0] == messages[1] and "--restart moves aside only a folder it wrote" in messages[0]
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def _one_refused_worker(rank: int, port: int, store: str, out: str, results: str, machines: int,
                        refusal: str = "store", command: str = "pretrain") -> None:
    """A two-process ``coclr pretrain`` (or pipeline) on ``machines`` machines (as torchrun describes them) whose
    process 1 is given a store that does not exist, as when one machine lacks the data (``refusal`` "store"), or an
    unknown flag ("flag")."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank if machines == 1 else 0), LOCAL_WORLD_SIZE=str(2 // machines),
                      GROUP_RANK=str(rank if machines == 2 else 0))
    torch.set_num_threads(1)
    import sys

    from coclr.cli import main
    from test_train import TINY

    sys.stderr = open(Path(results) / f"stderr{rank}", "w")  # noqa: SIM115 (the process's own, until it ends)
    given = str(Path(store).parent / "absent") if rank == 1 and refusal == "store" else store
    bogus = ["--bogus"] if rank == 1 and refusal == "flag" else []
    stages = (["pipeline.infonce_epochs=1", "pipeline.cycles=1", "--until", "infonce_rgb"] if command == "pipeline"
              else ["run.max_steps=2"])
    try:
        status = main([command, f"data.store={given}", f"run.out={out}", *TINY, *stages, *bogus])
    except SystemExit as stop:  # (argparse's refusal)
        status = stop.code
    sys.stderr.flush()
    Path(results, f"status{rank}").write_text(str(status))
    os._exit(0)


@pytest.mark.parametrize("machines, command", [(1, "pretrain"), (2, "pretrain"), (2, "pipeline")])
def test_a_process_refused_before_the_group_stops_the_others(tmp_path: Path, machines: int, command: str) -> None:
    """One process of a torchrun job refused before it joined the group (its machine lacks the data): the others
    waited for it in the group until its timeout (for ever on another machine: torchrun stops them only on the
    machine of the one that left). Every process stops, the refusal said once on each machine (a pipeline joined
    the group before its checks: the other machine said "another process ... lost its connection", and its folder
    was made)."""
    store = make_random_store(tmp_path / "store", videos=8)
    results = tmp_path / "results"
    results.mkdir()
    context = mp.start_processes(_one_refused_worker, args=(free_port(), str(store), str(tmp_path / "run"),
                                                            str(results), machines, "store", command), nprocs=2,
                                 join=False, start_method="spawn")
    assert ended_in_time(context), "a process still waited for the one refused"
    assert [(results / f"status{rank}").read_text() for rank in range(2)] == ["2", "2"]
    said = [(results / f"stderr{rank}").read_text().splitlines() for rank in range(2)]
    assert len(said[1]) == 1 and "absent" in said[1][0] and "torchrun" not in said[1][0], said[1]
    if machines == 1:  # the machine's console has the refused process's line
        assert said[0] == []
    else:
        assert len(said[0]) == 1 and said[0][0].startswith(f"coclr {command}: error: process 1 of the 2 of this "
                                                           "torchrun job was refused, so none starts: "), said[0]
        assert said[0][0].endswith(said[1][0].removeprefix(f"coclr {command}: error: "))
    assert not (tmp_path / "run").exists()


def test_a_command_line_refused_on_one_machine_stops_the_others(tmp_path: Path) -> None:
    """argparse's refusal (an unknown flag on one machine's command line) never reached the others, which waited
    in the group until its timeout (30 days for embed and flow)."""
    store = make_random_store(tmp_path / "store", videos=8)
    results = tmp_path / "results"
    results.mkdir()
    context = mp.start_processes(_one_refused_worker, args=(free_port(), str(store), str(tmp_path / "run"),
                                                            str(results), 2, "flag"), nprocs=2, join=False,
                                 start_method="spawn")
    assert ended_in_time(context), "a process still waited for the one refused"
    assert [(results / f"status{rank}").read_text() for rank in range(2)] == ["2", "2"]
    assert "unrecognized arguments: --bogus" in (results / "stderr1").read_text()
    assert "process 1 of the 2 of this torchrun job was refused, so none starts: its command line was refused" in (
        results / "stderr0").read_text()


def _task_worker(rank: int, port: int, record: str, results: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    import sys

    from coclr.cli import main

    sys.stderr = open(Path(results) / f"stderr{rank}", "w")  # noqa: SIM115 (the process's own, until it ends)
    status = main(["task", record])
    sys.stderr.flush()
    Path(results, f"status{rank}").write_text(str(status))
    os._exit(0)


def test_a_task_that_does_not_share_its_work_is_refused_under_torchrun(tmp_path: Path) -> None:
    """A flow task under torchrun ran whole in each process (one refused by its sibling's lock, which then waited in
    the group for the other to tell it): refused on every process alike, at once."""
    from coclr.atomic import atomic_write_json
    from coclr.flow.options import FlowOptions
    from coclr.jobs.tasks import Flow

    store = make_random_store(tmp_path / "store", videos=2)
    record = tmp_path / "flow.task.json"
    atomic_write_json(record, Flow(store, FlowOptions(backend="dis", view="flow_dis", workers=0)).record())
    results = tmp_path / "results"
    results.mkdir()
    context = mp.start_processes(_task_worker, args=(free_port(), str(record), str(results)), nprocs=2, join=False,
                                 start_method="spawn")
    assert ended_in_time(context), "a process waited"
    assert [(results / f"status{rank}").read_text() for rank in range(2)] == ["2", "2"]
    for rank in range(2):
        assert "a flow task runs as one process, not under torchrun" in (results / f"stderr{rank}").read_text()
    assert not (store / "flow_dis").exists()


def _pipeline_worker(rank: int, world: int, port: int, store: str, out: str, statuses: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from coclr.cli import main
    from test_train import TINY

    status = main(["pipeline", f"data.store={store}", f"run.out={out}", *[o for o in TINY if "batch_size" not in o],
                   "run.batch_size=2", "pipeline.infonce_epochs=1", "pipeline.cycles=1", "--until", "infonce_rgb"])
    Path(statuses, f"rank{rank}").write_text(str(status))


@pytest.mark.slow
def test_a_pipeline_runs_under_two_processes(tmp_path: Path) -> None:
    """``torchrun -m coclr pipeline`` was refused at its first stage: each process claimed the folder before the
    group was joined ("another coclr pipeline is writing this folder", naming rank 1)."""
    store = make_random_store(tmp_path / "store", videos=16)
    statuses = tmp_path / "statuses"
    statuses.mkdir()
    mp.spawn(_pipeline_worker, args=(2, free_port(), str(store), str(tmp_path / "p"), str(statuses)), nprocs=2,
             join=True)
    assert [(statuses / f"rank{r}").read_text() for r in range(2)] == ["0", "0"]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert [stage["status"] for stage in manifest["stages"]][:1] == ["done"]
    assert (tmp_path / "p" / "infonce_rgb" / "encoder_rgb.pth").is_file()


def _stopped_rank_worker(rank: int, world: int, port: int, store: str, out: str, results: str, stopped: int,
                         signum: int) -> None:
    """A torchrun pretrain whose process ``stopped`` gets ``signum`` once training is under way (SIGKILL: as the
    kernel's OOM killer ends it; SIGINT: Ctrl-C reaching it first)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import sys
    import threading

    from coclr.cli import main
    from test_train import TINY

    if signum == signal.SIGINT:  # as a terminal delivers it: a test run launched in the background (`cmd &`)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # starts its processes with SIGINT ignored
    if rank == stopped:
        def signal_later() -> None:
            while not (Path(out) / "checkpoint_last.pth").exists():
                time.sleep(0.05)
            os.kill(os.getpid(), signum)

        threading.Thread(target=signal_later, daemon=True).start()
    sys.stderr = open(Path(results) / f"stderr{rank}", "w")  # noqa: SIM115 (the process's own, until it ends)
    try:
        status = str(main(["pretrain", f"data.store={store}", f"run.out={out}",
                           *[o for o in TINY if "batch_size" not in o and "log_every" not in o and "queue" not in o],
                           "run.batch_size=2", "method.queue_size=4", "optim.epochs=500", "run.save_every=1"]))
    except BaseException as error:  # noqa: BLE001 (what the test looks at)
        status = f"raised {type(error).__name__}"
    sys.stderr.flush()
    Path(results, f"status{rank}").write_text(status)
    os._exit(0)  # the group's teardown would wait on a peer that left


@pytest.mark.slow
def test_a_killed_process_stops_the_others_in_one_line(tmp_path: Path) -> None:
    """One process of a torchrun pretrain killed: the others said it in an 80-line gloo traceback (twice chained)."""
    store = make_random_store(tmp_path / "store", videos=8)
    results = tmp_path / "results"
    results.mkdir()
    context = mp.spawn(_stopped_rank_worker, args=(2, free_port(), str(store), str(tmp_path / "run"), str(results), 1,
                                                    signal.SIGKILL), nprocs=2, join=False)
    for process in context.processes:
        process.join(timeout=120)
    assert (results / "status0").read_text() == "2"
    lines = (results / "stderr0").read_text().splitlines()
    assert len(lines) == 1 and "another process of this torchrun job stopped" in lines[0], lines[:5]
    assert "run the same torchrun command to continue" in lines[0]
    assert (tmp_path / "run" / "checkpoint_last.pth").is_file()


@pytest.mark.slow
def test_a_process_stopped_alone_stops_the_job_without_hanging(tmp_path: Path) -> None:
    """Ctrl-C (or an error) on one process of a torchrun job: it waited at a barrier on its way out while the
    others waited for it in a step's collective, and the job hung until torchrun killed it (or gloo's 30 minutes)."""
    store = make_random_store(tmp_path / "store", videos=8)
    results = tmp_path / "results"
    results.mkdir()
    context = mp.spawn(_stopped_rank_worker, args=(2, free_port(), str(store), str(tmp_path / "run"), str(results), 0,
                                                    signal.SIGINT), nprocs=2, join=False)
    started = time.monotonic()
    for process in context.processes:
        process.join(timeout=120)
    assert time.monotonic() - started < 110, "the job hung"
    assert (results / "status0").read_text() == "130"
    assert "interrupted" in (results / "stderr0").read_text()
    assert (results / "status1").read_text() == "2"
    assert "another process of this torchrun job stopped" in (results / "stderr1").read_text()
