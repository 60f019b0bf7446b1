"""OpenMP's wait policy and torch's huge-page allocations are set before torch loads, in every entry point
(checked in fresh interpreters)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coclr.threads import OPENMP_POLICY, PROCESS_POLICY, usable_cores

PROBE = ("import json, os, sys; {setup}; "
         "print(json.dumps({{'torch_loaded': 'torch' in sys.modules, "
         "'env': {{k: os.environ.get(k) for k in {keys!r}}}}}))")


def run_probe(setup: str, env: dict[str, str] | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in PROCESS_POLICY}
    code = PROBE.format(setup=setup, keys=list(PROCESS_POLICY))
    out = subprocess.run([sys.executable, "-c", code], env={**base, **(env or {})}, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("setup", ["import coclr.cli", "import coclr.__main__"])
def test_entry_points_set_the_policy_before_torch(setup):
    result = run_probe(setup)
    assert result["env"] == PROCESS_POLICY
    assert not result["torch_loaded"], "torch was imported before the policy could take effect"


def test_a_users_setting_is_kept():
    result = run_probe("import coclr.cli", {"OMP_WAIT_POLICY": "ACTIVE"})
    assert result["env"]["OMP_WAIT_POLICY"] == "ACTIVE"
    assert result["env"]["KMP_BLOCKTIME"] == OPENMP_POLICY["KMP_BLOCKTIME"]


def test_the_command_runs_with_the_policy(tmp_path):
    """``python -m coclr`` (as torchrun starts it) reaches a subcommand with the policy in its environment."""
    base = {k: v for k, v in os.environ.items() if k not in PROCESS_POLICY}
    code = ("import os, sys, runpy; sys.argv = ['coclr', '--help']\n"
            "try:\n    runpy.run_module('coclr', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('POLICY', os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == f"POLICY {OPENMP_POLICY['OMP_WAIT_POLICY']} False"


FORKS = """
import os, sys, time
import numpy as np, cv2
{guard}

cv2.setNumThreads(2)
image = np.random.default_rng(0).random((2000, 2000), dtype=np.float32)
hung = 0
for _ in range(8):
    for _ in range(3):
        cv2.GaussianBlur(image, (21, 21), 5)  # OpenCV's pool runs in the parent, and it forks right after
    pid = os.fork()
    if pid == 0:
        worker_opencv_threads()  # hung in about one fork in two without the fork guard
        cv2.GaussianBlur(image, (21, 21), 5)
        os._exit(0)
    deadline = time.monotonic() + 20
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if time.monotonic() > deadline:
            hung += 1
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(0.02)
print("HUNG", hung, cv2.getNumThreads())
"""
GUARD = "from coclr.threads import worker_opencv_threads"
UNGUARDED = "def worker_opencv_threads():\n    cv2.setNumThreads(1)"


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="fork hooks are POSIX-only")
def test_workers_forked_after_opencvs_pool_ran_do_not_hang(tmp_path):
    """Without the guard (``FORKS.format(guard=UNGUARDED)``) some of the 8 children hang in cv2.setNumThreads."""
    script = tmp_path / "forks.py"
    script.write_text(FORKS.format(guard=GUARD))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400, check=True)
    assert out.stdout.strip().splitlines()[-1] == "HUNG 0 2"  # none hung; the parent keeps its 2 threads


LOADER = """
{setup}
import torch
from multiprocessing.util import get_temp_dir
from torch.utils.data import DataLoader, TensorDataset

batches = DataLoader(TensorDataset(torch.arange(64.0).reshape(16, 4)), batch_size=4, num_workers=1)
print(sum(float(batch.sum()) for batch, in batches), get_temp_dir(), flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="Unix sockets under TMPDIR, as on Linux")
@pytest.mark.parametrize("setup", ["import coclr.cli", "import coclr.store.flow_extract"])
def test_a_loader_with_workers_runs_under_a_temporary_folder_too_long_for_a_socket(tmp_path, setup):
    """A worker hands each batch to its parent through a Unix socket under multiprocessing's temporary folder: with
    ``TMPDIR`` too long for a socket path, Python 3.11 drops the batch and the parent waits for ever. Importing
    coclr, by the command line or as a library, gives multiprocessing a short folder instead (removed at exit);
    ``TMPDIR`` is left as the user set it."""
    long = tmp_path / ("t" * 60) / ("m" * 40)
    long.mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(long)}
    done = subprocess.run([sys.executable, "-c", LOADER.format(setup=setup)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    total, folder = done.stdout.split()
    assert float(total) == sum(range(64)) and not folder.startswith(str(long))
    assert len(folder) + len("/listener-XXXXXXXX") <= 107 and not os.path.exists(folder)  # removed at exit
    assert list(long.iterdir()) == []


_FAULTS = """
import resource, sys
import numpy as np
from coclr.threads import freed_memory_reused

def faults_of_a_64mb_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.empty(64 << 20, np.uint8)
    block[::4096] = 1  # touch every page
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

if sys.argv[1] == "worker":  # a training loader's worker keeps its freed memory for its life
    from coclr.train.trainer import train_loader_worker
    train_loader_worker(0)
    faults_of_a_64mb_block()
    print(faults_of_a_64mb_block())
    sys.exit()
if sys.argv[1] == "nested":  # an inner stretch's end keeps the outer's policy; a policy for life outlasts both
    with freed_memory_reused():
        with freed_memory_reused():
            pass
        faults_of_a_64mb_block()
        inner_ended = faults_of_a_64mb_block()
    from coclr.threads import reuse_freed_memory
    reuse_freed_memory()
    with freed_memory_reused():
        pass
    faults_of_a_64mb_block()
    print(inner_ended, faults_of_a_64mb_block())
    sys.exit()
with freed_memory_reused() as took:
    faults_of_a_64mb_block()
    within = faults_of_a_64mb_block()
faults_of_a_64mb_block()
print(took, within, faults_of_a_64mb_block())
"""


def test_freed_memory_is_reused_without_faulting_again_then_handed_back():
    """Within :func:`freed_memory_reused` a large block freed and allocated again is the same memory, its pages
    present: the second 64 MB block faults (almost) nowhere. After it, as by default, each of its pages faults again
    (at least one fault per 2 MB, huge pages or not): the memory was handed back. A training loader's worker keeps
    its freed memory from its start; stretches nest, and one ending leaves a policy set for the process's life."""
    from pathlib import Path

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt: Linux")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    run = subprocess.run([sys.executable, "-c", _FAULTS, "context"], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    took, within, after = run.stdout.split()
    if took != "True":
        pytest.skip("this C library has no mallopt (not glibc)")
    assert int(within) <= 8 and int(after) >= 32
    worker = subprocess.run([sys.executable, "-c", _FAULTS, "worker"], capture_output=True, text=True, env=env,
                            timeout=300, check=True)
    assert int(worker.stdout.split()[-1]) <= 8  # the training loader's workers (train_loader_worker) keep theirs
    nested = subprocess.run([sys.executable, "-c", _FAULTS, "nested"], capture_output=True, text=True, env=env,
                            timeout=120, check=True)
    assert [int(n) <= 8 for n in nested.stdout.split()] == [True, True]


def test_torch_threads_are_set_for_a_block_and_restored():
    import torch

    from coclr.threads import torch_threads

    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="at least 1"), torch_threads(0):
        pass


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_usable_cores_follow_the_affinity_every_default_starts_from():
    """A process given one CPU (taskset, a container's cpuset) counts one, where os.cpu_count() counts the machine."""
    code = ("import os; from coclr.threads import usable_cores; from coclr.store.flow_extract import cpu_workers; "
            "os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[0]]); print(usable_cores(), cpu_workers(None))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert found == ["1", "1"]
    assert usable_cores() == len(os.sched_getaffinity(0)) >= 1


def test_every_workers_option_refuses_counts_no_run_should_start(tmp_path, capsys):
    """One rule for every ``workers`` option: negative or more than most_workers() (8 per usable core, 64 anywhere)
    is refused before any work, naming the option; None and 0 pass (``coclr flow --workers 10000`` started a process
    per video)."""
    from coclr.cli import main
    from coclr.config import from_dict
    from coclr.embed.options import EmbedJob
    from coclr.errors import ConfigError
    from coclr.eval.options import ClipConfig
    from coclr.learn.options import LearnOptions
    from coclr.threads import check_workers, most_workers

    most = most_workers()
    assert most == max(64, 8 * usable_cores())
    for fine in (None, 0, 1, most):
        check_workers(fine, "workers")
    for bad, said in ((-1, "must be 0 or more"), (most + 1, f"at most {most}")):
        with pytest.raises(ConfigError, match=f"^--workers: .*{said}"):
            check_workers(bad, "--workers")
    with pytest.raises(ConfigError, match="^--workers: .* at most"):
        LearnOptions(workers=most + 1).validate()
    with pytest.raises(ConfigError, match="^--workers: .* at most"):
        EmbedJob(workers=most + 1).validate()
    with pytest.raises(ConfigError, match="^workers: .* at most"):
        from_dict(ClipConfig, {"workers": most + 1})
    synth, tiny = tmp_path / "synth", ["train_scenes=8", "test_scenes=2", "frames=8", "height=32", "width=32"]
    assert main(["data", "synth", "--out", str(synth), "--workers", str(most + 1), *tiny]) == 2
    assert f"at most {most}" in capsys.readouterr().err
    assert not synth.exists()  # refused before anything was written
    assert main(["data", "synth", "--out", str(synth), "--workers", "0", *tiny]) == 0
    capsys.readouterr()
    assert main(["flow", str(synth), "--backend", "dis", "--workers", "10000"]) == 2
    assert "workers: 10000 worker processes" in capsys.readouterr().err
    assert not (synth / "flow_dis").exists()
