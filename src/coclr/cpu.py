"""What this CPU has, for choosing a CPU-specific path by instruction set, and the environment that runs a CPU
with AVX-512 as one with AVX2 only.

A path that depends on the CPU is chosen by what the CPU has (its instruction-set flags and the limits set on
the libraries that use them), never by what was faster on one machine; and a path chosen so changes the speed,
never the result (the exact search decides whatever its first pass rounded; the embedding's float32 network is
the default on every CPU).

``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` is not the test for bfloat16 instructions: it is true on every
CPU with AVX-512 BW/VL/DQ (oneDNN then converts bfloat16 with float32 instructions), e.g. on a Cascade Lake Xeon
without AVX512_BF16 or AMX, where a bfloat16 matrix product runs 3x slower than the float32 one
(docs/performance.md). :func:`native_bfloat16` is.

:data:`AVX2_LIMIT` is the environment of the AVX2-only CPU kind as one can emulate it on a CPU with AVX-512: every
library that picks its kernels by CPU is told to use its AVX2 ones. It is an emulation of the kind (same cores,
caches and memory), not a measurement of another machine (an AMD EPYC with AVX2 only, say).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

from coclr.errors import ConfigError

#: The flags of ``/proc/cpuinfo`` that decide which kernels run (printed by the benchmarks with every figure).
RELEVANT_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
                  "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")

#: oneDNN ISA limits (``ONEDNN_MAX_CPU_ISA``) that still allow its AVX512_BF16 or AMX kernels.
_ONEDNN_BF16_ISAS = {"avx512_core_bf16", "avx512_core_fp16", "avx10_1_512", "avx512_core_amx", "avx10_1_512_amx",
                     "avx512_core_amx_fp16", "avx10_1_512_amx_fp16", "avx10_2_512", "avx10_2_512_amx_2", "all",
                     "default"}


def _numpy_avx512_features() -> str:
    """NumPy's dispatched features of AVX-512 level (their names changed in NumPy 2.4: ``X86_V4`` ...)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__  # noqa: PLC0415 (private, NumPy 2)
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_dispatch__  # noqa: PLC0415 (NumPy 1)
        except ImportError:
            return ""
    return " ".join(name for name in __cpu_dispatch__ if name.startswith(("AVX512", "X86_V4")))


#: The environment of the AVX2-only kind on a CPU with AVX-512 (set before the libraries load: in a child
#: process). PyTorch's own kernels (``ATEN_CPU_CAPABILITY``), oneDNN (``ONEDNN_MAX_CPU_ISA``: its convolutions,
#: and bfloat16 products without AVX512_BF16/AMX), MKL (``MKL_ENABLE_INSTRUCTIONS``: PyTorch's float32 products),
#: OpenBLAS (``OPENBLAS_CORETYPE``: NumPy's and FAISS's products), FAISS's own SIMD (``FAISS_SIMD_LEVEL``),
#: NumPy's loops (``NPY_DISABLE_CPU_FEATURES``) and OpenCV's dispatched kernels (``OPENCV_CPU_DISABLE``: its
#: AVX512_SKX code; ``cv2.getCPUFeaturesLine()`` marks it ``?``). libjpeg-turbo has no AVX-512 code.
AVX2_LIMIT = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
              "OPENBLAS_CORETYPE": "Haswell", "FAISS_SIMD_LEVEL": "AVX2",
              "NPY_DISABLE_CPU_FEATURES": _numpy_avx512_features(), "OPENCV_CPU_DISABLE": "AVX512-SKX"}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    for key, value in _cpuinfo():
        if key == "model name":
            return value
    return platform.processor() or "unknown CPU"


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags (``/proc/cpuinfo``; empty where there is none)."""
    for key, value in _cpuinfo():
        if key in ("flags", "Features"):
            return set(value.split())
    return set()


def _cpuinfo() -> list[tuple[str, str]]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    return [(key.strip(), value.strip()) for key, _, value in (line.partition(":") for line in lines)]


def limits() -> dict[str, str]:
    """The kernel limits set in this environment (the keys of :data:`AVX2_LIMIT` that are set)."""
    return {key: os.environ[key] for key in AVX2_LIMIT if os.environ.get(key)}


def describe() -> str:
    """One line: the CPU model, which of :data:`RELEVANT_FLAGS` it has and lacks, PyTorch's capability where torch
    is imported already, whether bfloat16 products are native (:func:`native_bfloat16`), and the limits set (an
    emulated AVX2 kind says so)."""
    flags = cpu_flags()
    has = [flag for flag in RELEVANT_FLAGS if flag in flags]
    lacks = [flag for flag in RELEVANT_FLAGS if flag not in flags]
    line = f"CPU {cpu_model()}, {os.cpu_count()} logical cores; flags: {' '.join(has) or 'none of these'}"
    if lacks:
        line += f"; lacks: {' '.join(lacks)}"
    torch = sys.modules.get("torch")
    if torch is not None:
        line += f"; PyTorch capability {torch.backends.cpu.get_cpu_capability()}"
    line += f"; native bfloat16 products: {'yes' if native_bfloat16() else 'no'}"
    limited = limits()
    line += ("; kernels: this CPU as is" if not limited else
             "; kernels limited (emulated AVX2 kind): " + " ".join(f"{key}={value}" for key, value in limited.items()))
    return line


def native_bfloat16() -> bool:
    """Whether a bfloat16 matrix product runs on bfloat16 dot-product instructions here: the CPU has AVX512_BF16 or
    AMX-BF16 (``/proc/cpuinfo``), and neither PyTorch's capability (``ATEN_CPU_CAPABILITY``) nor oneDNN's ISA
    (``ONEDNN_MAX_CPU_ISA``) is limited below them. Elsewhere PyTorch's bfloat16 products convert to float32 and run
    slower than a float32 product (docs/performance.md). Without ``/proc/cpuinfo`` the answer is False: the float32
    paths are right everywhere. Reads the flags and the environment only (no torch import)."""
    if not {"avx512_bf16", "amx_bf16"} & cpu_flags():
        return False
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten not in ("", "default", "avx512"):
        return False
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return isa is None or isa.strip().lower() in _ONEDNN_BF16_ISAS


def require_native_bfloat16(key: str, remedy: str) -> None:
    """Refuse bfloat16 work on a CPU without bfloat16 instructions (:func:`native_bfloat16`), in one line naming the
    option ``key`` and what to do: there oneDNN converts to float32 and runs slower than float32, and the numbers
    differ from a CPU that has them (``coclr embed --precision bf16``, ``coclr eval --amp``)."""
    if not native_bfloat16():
        raise ConfigError(f"{key}: this CPU has no bfloat16 instructions (AVX512_BF16 or AMX); {remedy}")


def c_march() -> str | None:
    """The ``-march`` flag of the C code compiled on first use (the CPU TV-L1's loops, :mod:`coclr.flow.tvl1_cpu`):
    this CPU's instruction set (``-march=native``), or on x86-64 the one PyTorch's capability is limited to:
    ``ATEN_CPU_CAPABILITY=avx2`` (as in :data:`AVX2_LIMIT`) gives ``-march=x86-64-v3`` (AVX2 and FMA),
    ``default`` gives None (the compiler's baseline). The loops compute the same bits on every instruction set (no
    fast-math, no FMA contraction): only their speed depends on it."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if platform.machine().lower() in ("x86_64", "amd64") and aten in ("avx2", "default"):
        return "-march=x86-64-v3" if aten == "avx2" else None
    return "-march=native"


def arithmetic(device: Any) -> dict[str, Any]:
    """What orders a run's sums on ``device`` (a ``torch.device``; a training or finetuning checkpoint records it):
    on a CPU, the threads and the kernels PyTorch and oneDNN use.
    oneDNN's convolutions split their sums by the thread count and the instruction set, and training amplifies
    the last-bit differences, so a run continued with others drifts from the run it would have been."""
    import torch  # noqa: PLC0415 (heavy: only where a run is)

    if device.type != "cpu":
        return {"device": device.type}
    return {"device": "cpu", "threads": torch.get_num_threads(),
            "kernels": torch.backends.cpu.get_cpu_capability(), "limits": limits()}


def arithmetic_changes(recorded: Any, now: dict[str, Any], world: Any, processes: int, run: str = "the run"
                       ) -> list[str]:
    """What differs between a checkpoint's :func:`arithmetic` (and its number of processes, ``world``) and this
    process's, each as a line saying that the continuation (of ``run``) is not the uninterrupted one and how to make
    it so; none for a checkpoint that recorded nothing (from before it was kept) or of another device."""
    changes = []
    if isinstance(world, int) and world != processes:
        changes.append(f"{run} trained as {world} process(es) and continues as {processes} (each process's "
                       "BatchNorm sees its own share of a batch): from here it is not what it would have been "
                       f"uninterrupted; {world} processes continue it exactly")
    if not isinstance(recorded, dict) or recorded.get("device") != "cpu" or now.get("device") != "cpu":
        return changes
    if recorded.get("threads") != now["threads"]:
        changes.append(f"{run} trained on {recorded.get('threads')} thread(s) and continues on {now['threads']} "
                       "(oneDNN's convolutions order their sums by the thread count): from here it drifts from "
                       f"what it would have been uninterrupted; OMP_NUM_THREADS={recorded.get('threads')} continues it "
                       "exactly")
    if (recorded.get("kernels"), recorded.get("limits")) != (now["kernels"], now["limits"]):
        changes.append(f"{run} trained with {recorded.get('kernels')} kernels{_limited(recorded.get('limits'))} "
                       f"and continues with {now['kernels']}{_limited(now['limits'])} (another CPU kind, or "
                       "coclr.cpu.AVX2_LIMIT): from here it drifts from what it would have been uninterrupted")
    return changes


def _limited(limits: Any) -> str:
    return f" (limited: {', '.join(f'{key}={value}' for key, value in limits.items())})" \
        if isinstance(limits, dict) and limits else ""
