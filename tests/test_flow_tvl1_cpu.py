"""The fused C loops of the CPU TV-L1 (coclr.flow.tvl1_cpu) against the PyTorch operations they replace: one pass
and the median against TorchPasses, whole flows on real and random frames, bit-identical results across thread
counts and chunk sizes, the compile cache and the fallback when no compiler works."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from coclr import native
from coclr.errors import DataError
from coclr.flow import tvl1_cpu
from coclr.flow.params import TVL1Params
from coclr.flow.tvl1 import ScaleSolver, TorchPasses, make_passes, primal_dual_step, solve_pyramid, tvl1_flow
from coclr.flow.tvl1_cpu import CPasses
from middlebury import endpoint_error, read_flo

pytestmark = pytest.mark.skipif(native.find_compiler() is None, reason="no C compiler found (set CC or install gcc)")
STEPS = (0.15 * 0.3, 0.3, 0.25 / 0.3)


@pytest.fixture(scope="module")
def c_kernels() -> CPasses:
    """The C kernels (a compiler is present here, so failing to build them is a failure, not a skip)."""
    passes = tvl1_cpu.c_passes(required=True)
    assert passes is not None
    return passes


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def smooth_texture(height: int, width: int, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).uniform(0, 255, size=(height, width)).astype(np.float32)
    blurred = cv2.GaussianBlur(noise, (0, 0), 2.0)
    return ((blurred - blurred.min()) / (blurred.max() - blurred.min()) * 255).astype(np.uint8)


def random_state(batch: int, channels: int, height: int, width: int, seed: int = 0):
    """A plausible mid-solve state: flow, dual variables, image gradient, rho and -1/|grad|^2."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=generator) * scale

    flow, px, py = randn(batch, channels, height, width), randn(batch, channels, height, width, scale=0.2), \
        randn(batch, channels, height, width, scale=0.2)
    grad = randn(batch, channels, height, width, scale=10.0)
    if channels == 3:
        grad[:, 2] = 0.2
    rho = randn(batch, 1, height, width, scale=5.0)
    ninv = -1.0 / grad[:, :2].square().sum(1, keepdim=True).clamp_min(1.2e-7)
    return flow, px, py, grad, rho, ninv


def solve(prev, nxt, params, passes, mode="exact"):
    """solve_pyramid with ``passes``; returns the flow and the pair-iterations run."""
    solver = ScaleSolver(params, passes, 1, mode)
    return solve_pyramid(prev, nxt, params, solver), solver.pair_iterations


class DrivenPasses:
    """The C passes without run_warp: ScaleSolver drives run_pass and median itself."""

    fused = True

    def __init__(self, passes: CPasses) -> None:
        self.run_pass, self.median = passes.run_pass, passes.median


# ---- the pieces against TorchPasses -------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [2, 3])
@pytest.mark.parametrize("exact", [True, False])
def test_pass_matches_torch_passes(c_kernels, channels, exact):
    flow, px, py, grad, rho, ninv = random_state(3, channels, 13, 17, seed=channels)
    active = torch.tensor([True, False, True])
    first_change = primal_dual_step(flow, px, py, grad, rho, ninv, torch.ones(3, 1, 1, 1), *STEPS)[3]
    for n in (1, 4):
        # n = 4: pair 2 meets the test at the first iteration, so exact mode stops it there, mid-pass
        threshold = 0.0 if n == 1 else 1.01 * float(first_change[2])
        theirs = TorchPasses().run_pass(flow, px, py, grad, rho, ninv, active, n, threshold, *STEPS, exact)
        ours = c_kernels.run_pass(flow, px, py, grad, rho, ninv, active, n, threshold, *STEPS, exact)
        for mine, reference in zip(ours[:3], theirs[:3]):
            torch.testing.assert_close(mine, reference, atol=2e-5, rtol=1e-5)
        assert torch.equal(ours[3], theirs[3]) and ours[3][2] == (n == 1)
        for state, before in zip(ours[:3], (flow, px, py)):
            assert torch.equal(state[1], before[1])  # the frozen pair is untouched
        assert not torch.equal(ours[0][0], flow[0])


@pytest.mark.parametrize("ksize", [3, 5])
@pytest.mark.parametrize("size", [(3, 3), (4, 7), (23, 31)])
def test_median_is_torchs_bit_for_bit(c_kernels, ksize, size):
    flow = random_state(2, 3, *size, seed=ksize)[0]
    flow[0, 0, 1:3, 1:3] = 0.5  # ties
    active = torch.tensor([True, False])
    ours = c_kernels.median(flow, active, ksize)
    assert torch.equal(ours, TorchPasses().median(flow, active, ksize))
    assert torch.equal(ours[1], flow[1]) and torch.equal(ours[0, 2], flow[0, 2])  # frozen pair, gamma untouched
    assert not torch.equal(ours[0, :2], flow[0, :2])


# ---- whole flows ----------------------------------------------------------------------------------------------


def pairs_of_frames() -> tuple[torch.Tensor, torch.Tensor]:
    """A sub-pixel translation, two unrelated images (chaotic: tiny differences grow) and a wrapped shift."""
    texture = smooth_texture(64, 80, seed=3)
    shifted = cv2.warpAffine(texture, np.float32([[1, 0, 1.6], [0, 1, -0.7]]), (80, 64), flags=cv2.INTER_CUBIC,
                             borderMode=cv2.BORDER_REFLECT)
    other = smooth_texture(64, 80, seed=4)
    prev = torch.from_numpy(np.stack([texture, texture, other]))
    nxt = torch.from_numpy(np.stack([shifted, other, np.roll(other, (2, 1), axis=(0, 1))]))
    return prev, nxt


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("gamma", [0.0, 0.2])
def test_flow_is_torchs_to_float_rounding(c_kernels, mode, gamma):
    prev, nxt = (frames[[0, 2]] for frames in pairs_of_frames())  # the pairs with a true motion
    params = TVL1Params(nscales=3, gamma=gamma, median_filtering=5 if gamma else 3)
    ours, ours_iterations = solve(prev, nxt, params, c_kernels, mode)
    theirs, their_iterations = solve(prev, nxt, params, TorchPasses(), mode)
    # float rounding (PyTorch's sqrt, its float32 sum of the stop test) moves a stop by an iteration at most
    difference = (ours - theirs).abs()
    assert difference.mean() < 0.01, difference.mean()
    assert (difference > 0.1).float().mean() < 0.01
    assert abs(ours_iterations - their_iterations) <= 0.02 * their_iterations
    # the whole warp in one C call equals ScaleSolver driving the C passes and median, bit for bit
    assert torch.equal(ours, solve(prev, nxt, params, DrivenPasses(c_kernels), mode)[0])


@pytest.mark.parametrize("median", [0, 1])
@pytest.mark.parametrize("size", [(3, 3), (5, 9), (19, 21)])
def test_small_frames_and_no_median_follow_torch(c_kernels, median, size):
    texture = torch.from_numpy(smooth_texture(*size, seed=5))
    prev, nxt = texture[None], torch.roll(texture, 1, dims=1)[None]
    params = TVL1Params(nscales=2, warps=2, median_filtering=median)
    ours = solve(prev, nxt, params, c_kernels)[0]
    torch.testing.assert_close(ours, solve(prev, nxt, params, TorchPasses())[0], atol=1e-3, rtol=0)
    assert torch.equal(ours, solve(prev, nxt, params, DrivenPasses(c_kernels))[0])


def test_same_bits_on_any_thread_count_and_chunk(c_kernels):
    prev, nxt = pairs_of_frames()
    params = TVL1Params(nscales=3)
    reference = tvl1_flow(prev, nxt, params, kernels="c", chunk_size=3)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for chunk in (1, 2, 3):
            assert torch.equal(tvl1_flow(prev, nxt, params, kernels="c", chunk_size=chunk), reference)
        assert torch.equal(tvl1_flow(prev[1:2], nxt[1:2], params, kernels="c"), reference[1:2])


def test_same_bits_on_every_instruction_set(tmp_path):
    """The loops compiled for the baseline, for AVX2 (the AVX2-only CPU kind) and for this CPU (AVX-512 here, where
    it has it) compute the same flow bit for bit, in both of the loops' channel counts (gamma adds the third)."""
    compiler = native.find_compiler()
    cpu_flags = native.cpu_flags().split()
    marches = [None, "-march=native"] + (["-march=x86-64-v3"] if {"avx2", "fma"} <= set(cpu_flags) else [])
    libraries = []
    for index, march in enumerate(marches):
        flags = [flag for flag in native.FLAGS if flag != "-march=native"] + ([march] if march else [])
        (tmp_path / str(index)).mkdir()
        libraries.append(tvl1_cpu.Library(tvl1_cpu.KERNEL.compile(list(compiler), flags, tmp_path / str(index))))
    prev, nxt = pairs_of_frames()
    for gamma in (0.0, 0.2):
        params = TVL1Params(nscales=3, gamma=gamma, median_filtering=5 if gamma else 3)
        flows = [solve(prev, nxt, params, CPasses(library))[0] for library in libraries]
        assert all(torch.equal(flow, flows[0]) for flow in flows[1:]), (gamma, marches)


@pytest.mark.parametrize(("capability", "march"), [("", "-march=native"), ("avx2", "-march=x86-64-v3"),
                                                    ("default", None), ("AVX512", "-march=native")])
def test_the_instruction_set_follows_pytorchs_limit(monkeypatch, capability, march):
    """``ATEN_CPU_CAPABILITY`` (coclr.cpu.AVX2_LIMIT's emulation of the AVX2-only kind) limits the C loops too, on
    x86-64; the flags are part of the cache key, so each limit has its own compiled object."""
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    flags = native.compile_flags()
    assert [flag for flag in flags if flag.startswith("-march")] == ([march] if march else [])
    assert [flag for flag in flags if not flag.startswith("-march")] == [
        flag for flag in native.FLAGS if flag != "-march=native"]


def test_middlebury_crop_as_accurate_as_torch(c_kernels, middlebury):
    root = Path(middlebury) / "RubberWhale"
    crop = (slice(100, 260), slice(150, 350))
    prev, nxt = (torch.from_numpy(np.ascontiguousarray(cv2.imread(str(root / f"frame{i}.png"), 0)[crop]))[None]
                 for i in (10, 11))
    gt = read_flo(root / "flow10.flo")[crop]
    for mode in ("exact", "fast"):
        ours = tvl1_flow(prev, nxt, mode=mode, kernels="c")[0].permute(1, 2, 0).numpy()
        theirs = tvl1_flow(prev, nxt, mode=mode, kernels="torch")[0].permute(1, 2, 0).numpy()
        assert endpoint_error(ours, gt)["epe"] == pytest.approx(endpoint_error(theirs, gt)["epe"], rel=5e-3)
        assert np.abs(ours - theirs).mean() < 2e-3


def test_auto_takes_the_c_kernels_on_the_cpu(c_kernels):
    assert isinstance(make_passes("auto", torch.device("cpu")), CPasses)
    assert isinstance(make_passes("torch", torch.device("cpu")), TorchPasses)
    with pytest.raises(DataError, match="CPU tensors"):
        make_passes("c", torch.device("meta"))


# ---- compiling, the cache, the fallback --------------------------------------------------------------------


def test_compiled_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COCLR_CACHE_DIR", str(tmp_path / "cache"))
    path = tvl1_cpu.KERNEL.build()
    assert path.parent == tmp_path / "cache" and path.name.startswith("tvl1_cpu-")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind

    def no_compiling(*args):
        raise AssertionError("compiled again")

    monkeypatch.setattr(native, "compile_sources", no_compiling)
    assert tvl1_cpu.KERNEL.build() == path
    tvl1_cpu.Library(path)  # loads


def test_cache_key_covers_source_compiler_flags_and_cpu(monkeypatch):
    key = native.cache_key("src", ["cc"], "gcc 12", ["-O3"])
    assert key == native.cache_key("src", ["cc"], "gcc 12", ["-O3"])
    others = [("src2", ["cc"], "gcc 12", ["-O3"]), ("src", ["clang"], "gcc 12", ["-O3"]),
              ("src", ["cc"], "gcc 13", ["-O3"]), ("src", ["cc"], "gcc 12", ["-O2"])]
    assert all(native.cache_key(*other) != key for other in others)
    monkeypatch.setattr(native, "cpu_flags", lambda: "sse2 avx512f")
    assert native.cache_key("src", ["cc"], "gcc 12", ["-O3"]) != key


def test_median_code_is_generated_from_the_plan():
    from coclr.flow.median import median_plan

    source = tvl1_cpu.median_source(5)
    column_sort, rows, final = median_plan(5)
    comparators = len(column_sort) + sum(len(network) for _, network in rows) + len(final)
    assert source.count("MINF") + source.count("MAXF") == comparators + sum(
        1 for a, b, keep_min, keep_max in [*column_sort, *(c for _, n in rows for c in n), *final]
        if keep_min and keep_max)


@pytest.mark.parametrize("failure", ["no compiler", "compile error"])
def test_fallback_to_torch_with_one_warning(tmp_path, monkeypatch, failure):
    monkeypatch.setenv("COCLR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tvl1_cpu.KERNEL, "_state", [])
    if failure == "no compiler":
        monkeypatch.setattr(native, "find_compiler", lambda: None)
        expected = "no C compiler found"
    else:
        monkeypatch.setenv("CC", "false")  # runs, and fails
        expected = "false failed"
    with pytest.warns(RuntimeWarning, match=rf"CPU flow runs without them \(slower\): {expected}") as caught:
        passes = make_passes("auto", torch.device("cpu"))
        assert isinstance(make_passes("auto", torch.device("cpu")), TorchPasses)  # warned once, not again
    assert isinstance(passes, TorchPasses) and len(caught) == 1
    with pytest.raises(DataError, match="kernels='c'"):
        make_passes("c", torch.device("cpu"))
    assert not list(tmp_path.iterdir())
    prev, nxt = pairs_of_frames()
    assert tvl1_flow(prev[:1], nxt[:1], TVL1Params(nscales=1, warps=1)).shape == (1, 2, 64, 80)


def test_nothing_is_compiled_at_import(tmp_path):
    env = {**os.environ, "COCLR_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-c", "import coclr.flow.tvl1, coclr.flow.tvl1_cpu"], env=env, check=True)
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_thread_pool():
    """The parent's pool has no threads in a forked child: the child must start its own, not wait forever."""
    torch.set_num_threads(2)
    assert native.for_each(4, lambda i: i * i) == [0, 1, 4, 9]  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the child exits 0 only with the right result
        try:
            os._exit(0 if native.for_each(4, lambda i: i + 1) == [1, 2, 3, 4] else 1)
        except BaseException:
            os._exit(2)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on its parent's thread pool")
