"""Every Triton kernel of the project (the TV-L1's, ``coclr.flow.tvl1_triton``; S3D's max-pools,
``coclr.models.pool_triton``) compiled ahead of time for an H100 (sm_90) on this machine, with no GPU: registers,
spills and shared memory per kernel and configuration.

The configurations are the ones the code launches: ``TritonPasses.run_pass`` and ``median`` are called on small CPU
tensors with the kernels replaced by recorders, for 2 and 3 flow channels (gamma off and on), every pass length
``stop_every`` allows (1..30) in both modes, and both median sizes; the pools' forward and backward for S3D's four
pool shapes, in bfloat16 and float32, at channel counts that give each channel block; each distinct launch
(constants, launch options, argument types) is compiled by ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``
(ptxas ships in the Triton wheel) and its PTX assembled again by the same ptxas with ``-v`` to read registers and
spills. It also prints the halo recompute factor of the pass kernel's tiling at the pyramid sizes of 128x171 and
256x340.

Exits 1 on a compile error or a spill in a default configuration: the default launch settings
(``TritonSettings()``) at pass lengths up to the default ``stop_every`` (5). The longer passes the option allows
need wider halos, hence larger blocks: they are compiled and their spills reported, not fatal, as are those of
other settings (``--block 64x32 --warps 4``). Without Triton it
prints one line and exits 0. Usage: ``python benchmarks/kernels_sm90.py [--block HxW] [--warps N]
[--expect-triton VERSION]``.

Two Tritons: the GPU machines run Triton 3.6 (what their PyTorch ships), CI installs the newest; a kernel that fits
the registers under one may spill under the other (the default 64x64 pass block spilled under 3.6 only). ``.ci/run``
therefore runs this check under both: the newest from the environment, and Triton 3.6 installed with ``pip install
--target`` into a side folder put first on ``PYTHONPATH``, with ``--expect-triton 3.6`` so that a wrong path fails
instead of checking the other Triton twice. ``pyproject.toml`` admits the Triton versions checked so (3.6 to 3.9).
Every launch passes ``enable_fp_fusion=False`` (``coclr.flow.tvl1_triton.FP_FUSION``), recorded here with the
launch and passed to the compile and to ptxas (``--fmad=false``); ``.ci/run`` also sets
``TRITON_DEFAULT_FP_FUSION=0``, so that the default the launches override is the same one.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from coclr.flow.params import FAST_STOP_EVERY, TVL1Params
from coclr.flow.tvl1 import pyramid_sizes

TARGET_ARCH = 90
PASS_LENGTHS = range(1, 31)
"""Every pass length ``stop_every`` admits (:func:`coclr.flow.params.check_mode`)."""
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int32: "i32", torch.int8: "i8", torch.int64: "i64"}
POOL_CHANNELS = (3, 24, 64, 832)
"""Channel counts of the pools' checks: blocks of 4, 32 and 64 channels (S3D's pools see 64 to 832)."""


@dataclass(frozen=True)
class Launch:
    """One launch as the code makes it: the kernel's name, its signature, constants and launch options."""

    kernel: str
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[str, object], ...]
    options: tuple[tuple[str, object], ...]
    default: bool
    module: str = "coclr.flow.tvl1_triton"


class Recorder:
    """Stands in for a ``@triton.jit`` function: ``kernel[grid](*args, **meta)`` records the launch, as a default
    one while ``default[0]`` is set."""

    def __init__(self, fn, launches: dict[tuple, bool], default: list[bool], module: str = "") -> None:
        self.fn, self.launches, self.default, self.module = fn, launches, default, module

    def __getitem__(self, grid):
        return self.record

    def record(self, *args, **meta) -> None:
        names = self.fn.arg_names
        values = dict(zip(names, args)) | {k: v for k, v in meta.items() if k in names}
        signature = tuple((name, "constexpr" if name not in dict(zip(names, args)) else _type_of(values[name]))
                          for name in names)
        constants = tuple((name, values[name]) for name, kind in signature if kind == "constexpr")
        options = tuple(sorted((k, v) for k, v in meta.items() if k not in names))
        key = (self.fn.__name__, signature, constants, options, self.module)
        self.launches[key] = self.launches.get(key, False) or self.default[0]


def _type_of(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def record_launches(settings_list) -> list[Launch]:
    """The distinct launches of ``TritonPasses`` with each of ``settings_list``; default: made with the first
    settings at a pass length up to the default ``stop_every``."""
    from coclr.flow import tvl1_triton

    launches: dict[tuple, bool] = {}
    default = [True]
    originals = {name: getattr(tvl1_triton, name) for name in ("_pass_kernel", "_stop_kernel", "_median_kernel")}
    try:
        for name, fn in originals.items():
            setattr(tvl1_triton, name, Recorder(fn, launches, default, tvl1_triton.__name__))
        for index, settings in enumerate(settings_list):
            passes = tvl1_triton.TritonPasses(settings)
            for channels in (2, 3):
                state = [torch.zeros(2, channels, 20, 24) for _ in range(4)] + [torch.zeros(2, 1, 20, 24)] * 2
                active = torch.ones(2, dtype=torch.bool)
                for n in PASS_LENGTHS:
                    default[0] = index == 0 and n <= FAST_STOP_EVERY
                    for exact in (True, False):
                        passes.run_pass(*state, active, n, 1e-3, 0.045, 0.3, 0.8, exact)
                default[0] = index == 0
                for ksize in (3, 5):
                    passes.median(state[0], active, ksize)
    finally:
        for name, fn in originals.items():
            setattr(tvl1_triton, name, fn)
    launches |= record_pool_launches()
    return sorted((Launch(*key[:4], default=is_default, module=key[4]) for key, is_default in launches.items()),
                  key=lambda launch: (not launch.default, launch.module, launch.kernel, str(launch.constants),
                                      str(launch.options)))


def record_pool_launches() -> dict[tuple, bool]:
    """The distinct launches of :func:`coclr.models.pool_triton.max_pool3d`, forward and backward, for S3D's pools
    (all default launches)."""
    from coclr.models import pool_triton
    from coclr.models.s3d import S3D, MaxPool3d

    geometries = {m.geometry for m in S3D(width=0.125).modules() if isinstance(m, MaxPool3d)}
    launches: dict[tuple, bool] = {}
    originals = {name: getattr(pool_triton, name) for name in ("_forward", "_backward")}
    try:
        for name, fn in originals.items():
            setattr(pool_triton, name, Recorder(fn, launches, [True], pool_triton.__name__))
        for geometry in sorted(geometries):
            for dtype in (torch.bfloat16, torch.float32):
                for channels in POOL_CHANNELS:
                    x = torch.zeros(1, channels, 4, 6, 6, dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
                    x.requires_grad_()
                    pool_triton.max_pool3d(x, *geometry).sum().backward()
    finally:
        for name, fn in originals.items():
            setattr(pool_triton, name, fn)
    return launches


@dataclass
class Usage:
    registers: int
    spill_bytes: int
    stack_bytes: int
    shared_bytes: int


def compile_sm90(launch: Launch, fn) -> Usage:
    """Compile ``launch`` for sm_90 and read its resource use from ptxas ``-v`` on the PTX Triton produced."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = dict(launch.signature)
    constants = dict(launch.constants)
    # torch's allocations are 16-byte aligned: the JIT marks every pointer argument so, as here
    attrs = {(index,): [["tt.divisibility", 16]] for index, (_, kind) in enumerate(launch.signature)
             if kind.startswith("*")}
    source = ASTSource(fn, signature, constants, attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", TARGET_ARCH, 32), options=dict(launch.options))
    return _ptxas_usage(kernel.asm["ptx"], kernel.metadata)


def _ptxas_usage(ptx: str, metadata) -> Usage:
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(TARGET_ARCH).path
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        fmad = [] if getattr(metadata, "enable_fp_fusion", True) else ["--fmad=false"]
        result = subprocess.run([ptxas, "-lineinfo", *fmad, "-v", "--regAllocOptLevel=2",
                                 f"--gpu-name={sm_arch_from_capability(TARGET_ARCH)}", str(source),
                                 "-o", str(Path(folder) / "kernel.cubin")],
                                capture_output=True, text=True, check=True)
    log = result.stdout + result.stderr
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    stack, stores, _ = (int(x) for x in re.search(
        r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log).groups())
    static = re.search(r"(\d+) bytes smem", log)
    return Usage(registers, stores, stack, metadata.shared + (int(static.group(1)) if static else 0))


def halo_factors(settings, pass_length: int = 5) -> dict[tuple[int, int], tuple[float, float]]:
    """Pixels the pass kernel computes per image pixel (tiles x block / image) at the two benchmark sizes: at the
    finest scale, and over the pyramid with each scale weighted by its pixels (the iterations per scale vary, so
    the true factor lies near the latter): the tiling's recompute factor at that pass length."""
    import triton

    from coclr.flow.tvl1_triton import block_shape

    params = TVL1Params()
    factors = {}
    for size in ((128, 171), (256, 340)):
        computed, pixels = [], []
        block_h, block_w = block_shape(settings, pass_length)
        for height, width in pyramid_sizes(*size, params.nscales, params.scale_step):
            inner_h, inner_w = block_h - 2 * pass_length, block_w - 2 * pass_length
            computed.append(triton.cdiv(height, inner_h) * triton.cdiv(width, inner_w) * block_h * block_w)
            pixels.append(height * width)
        factors[size] = (computed[0] / pixels[0], sum(computed) / sum(pixels))
    return factors


def _version_matches(version: str, expected: str) -> bool:
    """Whether ``version`` is ``expected`` or a release of it (``3.6.0`` matches ``3.6``, ``3.60`` does not)."""
    return version == expected or version.startswith(expected + ".") or version.startswith(expected + "+")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", action="append", default=[], help="also check this block shape, HxW")
    parser.add_argument("--warps", type=int, default=None, help="warps of the extra block shapes")
    parser.add_argument("--expect-triton", metavar="VERSION",
                        help="fail unless the Triton imported has this version (or a version starting with it)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("triton") is None:
        if args.expect_triton:
            print(f"kernels_sm90: FAIL, Triton {args.expect_triton} expected and triton is not installed")
            return 1
        print("kernels_sm90: skipped, triton is not installed (pip install triton)")
        return 0
    import triton

    if args.expect_triton and not _version_matches(triton.__version__, args.expect_triton):
        print(f"kernels_sm90: FAIL, Triton {args.expect_triton} expected, {triton.__version__} imported from "
              f"{Path(triton.__file__).parent}")
        return 1
    from coclr.flow import tvl1_triton
    from coclr.flow.tvl1_triton import TritonSettings
    from coclr.models import pool_triton

    modules = {module.__name__: module for module in (tvl1_triton, pool_triton)}

    default = TritonSettings()
    extra = []
    for shape in args.block:
        height, width = (int(x) for x in shape.lower().split("x"))
        extra.append(TritonSettings(block_h=height, block_w=width,
                                    num_warps=args.warps if args.warps else default.num_warps))
    print(f"Triton {triton.__version__} ({Path(triton.__file__).parent}), target sm_{TARGET_ARCH}; "
          f"default settings {default}; enable_fp_fusion={tvl1_triton.FP_FUSION} on every launch")
    failures = 0
    for launch in record_launches([default, *extra]):
        fn = getattr(modules[launch.module], launch.kernel)
        label = f"{launch.module.rsplit('.', 1)[-1]}.{launch.kernel} {dict(launch.constants)} {dict(launch.options)}"
        try:
            usage = compile_sm90(launch, fn)
        except Exception as error:  # noqa: BLE001 - every compile error is reported, then the exit code says so
            print(f"FAIL compile {label}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
            failures += 1
            continue
        verdict = "ok"
        if usage.spill_bytes and launch.default:
            verdict, failures = "FAIL spills", failures + 1
        elif usage.spill_bytes:
            verdict = "spills (not a default)"
        print(f"{'default' if launch.default else 'other  '} {label}: {usage.registers} registers, "
              f"{usage.spill_bytes} B spilled, {usage.stack_bytes} B stack, {usage.shared_bytes} B shared: {verdict}")
    for settings in (default, *extra):
        factors = halo_factors(settings)
        print(f"halo recompute at n=5, blocks {settings.block_h}x{settings.block_w}: " + ", ".join(
            f"{h}x{w} {finest:.2f}x finest scale, {pyramid:.2f}x pyramid"
            for (h, w), (finest, pyramid) in factors.items()))
    print(f"{failures} failure(s)" if failures else "all kernels compile for sm_90 without spills by default")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
